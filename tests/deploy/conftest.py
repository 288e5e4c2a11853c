"""Shared by the deployment tests: where the repository is, and each service's settings class."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic_settings import BaseSettings

from clairvoyant.core.config import ServiceSettings

REPO_ROOT = Path(__file__).resolve().parents[2]

SettingsLoader = Callable[[str], type[ServiceSettings] | None]


def settings_class(service: str) -> type[ServiceSettings] | None:
    """The settings class in ``clairvoyant.<service>.config``, or None while that module does not exist.

    The class is the one ``ServiceSettings`` subclass defined in the module itself (not imported into it).
    """
    if not (REPO_ROOT / "services" / service / "src" / "clairvoyant" / service / "config.py").exists():
        return None
    module = importlib.import_module(f"clairvoyant.{service}.config")
    found = [
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, ServiceSettings)
        and cls is not ServiceSettings
        and cls.__module__ == module.__name__
    ]
    assert len(found) == 1, f"clairvoyant.{service}.config defines {len(found)} settings classes: {found}"
    return found[0]


def env_name(cls: type[BaseSettings], field: str) -> str:
    """The environment variable that sets ``field`` (``CV_`` + the upper-cased name unless aliased)."""
    alias = cls.model_fields[field].validation_alias
    if isinstance(alias, str):
        return alias.upper()
    return f"{cls.model_config.get('env_prefix', '')}{field}".upper()


def service_dirs() -> list[str]:
    """Every installable package under services/ (those are what get an image)."""
    return sorted(p.name for p in (REPO_ROOT / "services").iterdir() if (p / "pyproject.toml").exists())


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def load_settings() -> SettingsLoader:
    return settings_class


@pytest.fixture(scope="session")
def settings_env_name() -> Callable[[type[BaseSettings], str], str]:
    return env_name


@pytest.fixture(scope="session")
def all_settings() -> dict[str, type[ServiceSettings]]:
    """``core`` -> ServiceSettings, then every service that has a settings class already."""
    found: dict[str, type[ServiceSettings]] = {"core": ServiceSettings}
    for service in service_dirs():
        cls = settings_class(service)
        if cls is not None:
            found[service] = cls
    return found
