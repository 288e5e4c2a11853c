"""The scheduler runs its routers' matrix products on one BLAS thread unless the operator chose."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

PROBE = (
    "import numpy; from clairvoyant.scheduler.__main__ import one_blas_thread; one_blas_thread(); "
    "from threadpoolctl import threadpool_info; "
    "print(sorted({i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas'}))"
)
CHOICES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def blas_threads(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in CHOICES}
    done = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_one_blas_thread_by_default() -> None:
    assert blas_threads() == "[1]"


def test_the_operators_choice_wins() -> None:
    assert blas_threads(OPENBLAS_NUM_THREADS="2") == "[2]"
