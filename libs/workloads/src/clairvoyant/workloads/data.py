"""Where the shared trace data lives: ``$CV_DATA_DIR``, else ``<repo>/../shared/data``."""

from __future__ import annotations

import os
from pathlib import Path

from clairvoyant.workloads.errors import WorkloadDataError

DATA_DIR_ENV = "CV_DATA_DIR"


def repo_root() -> Path:
    """The monorepo root: the nearest parent holding both ``pyproject.toml`` and ``bench/``."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file() and (parent / "bench").is_dir():
            return parent
    return Path.cwd()


def data_dir() -> Path:
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override)
    return repo_root().parent / "shared" / "data"


def require(relative: str, what: str, base: Path | None = None) -> Path:
    """The path of a data file, or ``WorkloadDataError`` naming where it was looked for."""
    path = (base or data_dir()) / relative
    if not path.exists():
        fix = (
            f"the data directory given ({base}) does not hold it"
            if base is not None
            else f"point {DATA_DIR_ENV} at the shared data directory"
        )
        raise WorkloadDataError(f"{what} needs {path}, which does not exist; {fix}")
    return path
