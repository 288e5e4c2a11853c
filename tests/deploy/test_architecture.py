"""The architecture's import rules (.importlinter) hold: services never import services, the shared
libraries know no service, cores import no transport or telemetry, the bench imports only cores."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = (
    "Services never import services",
    "The shared libraries import no service and no bench",
    "Cores and the policy package import no transport, telemetry or generated stubs",
    "The bench imports only cores, the policy package and the shared libraries",
)


def test_every_import_contract_is_kept() -> None:
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint_imports is not None, "import-linter is not installed (requirements-dev.txt)"
    result = subprocess.run(
        [lint_imports, "--no-cache", "--config", str(REPO_ROOT / ".importlinter")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    for name in CONTRACTS:  # each rule is stated, and checked
        assert f"{name} KEPT" in report, report
