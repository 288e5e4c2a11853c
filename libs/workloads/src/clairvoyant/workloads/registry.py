"""Workloads by name: the built-in specs (``builtin/*.yaml``) and the trace-driven replays.

``get_workload(name, **options)`` builds one; a path to a YAML/JSON spec works too, for workloads
users write themselves, and several names joined by ``+`` serve those workloads together (mix.py;
``kairos_mix`` is Kairos' three applications).  Options: ``models`` (alias -> served name, or one served name for all) for
every workload; ``data_dir`` and ``max_tool_latency_s`` for the trace-driven ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from clairvoyant.core.registry import Registry
from clairvoyant.workloads.base import Workload
from clairvoyant.workloads.generator import SpecWorkload
from clairvoyant.workloads.mix import SEPARATOR, MixWorkload
from clairvoyant.workloads.spec import load_spec
from clairvoyant.workloads.traces import TraceWorkload, chatdev, claude_code

BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
TRACE_WORKLOADS = ("chatdev", "claude_code")
# Kairos §2.1.2, §6: its three applications served together on one cluster.
MIX_WORKLOADS = {"kairos_mix": ("qa_router", "report_generate", "code_generate")}

WORKLOADS: Registry[Workload] = Registry("workload")


def _spec_factory(path: Path) -> Callable[..., Workload]:
    def build(models: Mapping[str, str] | str | None = None) -> Workload:
        workload = SpecWorkload.from_file(path)
        return workload.with_models(models) if models is not None else workload

    return build


def _trace_factory(load: Callable[..., TraceWorkload]) -> Callable[..., Workload]:
    def build(
        models: Mapping[str, str] | str | None = None,
        data_dir: Path | None = None,
        max_tool_latency_s: float | None = None,
    ) -> Workload:
        workload = load(data_dir, max_tool_latency_s)
        return workload.with_models(models) if models is not None else workload

    return build


for _path in sorted(BUILTIN_DIR.glob("*.yaml")):
    WORKLOADS.register(_path.stem)(_spec_factory(_path))
WORKLOADS.register("chatdev")(_trace_factory(chatdev))
WORKLOADS.register("claude_code")(_trace_factory(claude_code))


def _mix_factory(name: str, components: tuple[str, ...]) -> Callable[..., Workload]:
    def build(models: Mapping[str, str] | str | None = None) -> Workload:
        workload = MixWorkload(name, [WORKLOADS.create(c) for c in components])
        return workload.with_models(models) if models is not None else workload

    return build


for _name, _components in MIX_WORKLOADS.items():
    WORKLOADS.register(_name)(_mix_factory(_name, _components))


def list_workloads() -> list[str]:
    return WORKLOADS.names()


SPEC_SUFFIXES = (".yaml", ".yml", ".json")


def is_spec_path(name: str) -> bool:
    """``name`` names a spec file (by its suffix) rather than a registered workload."""
    return name not in WORKLOADS and Path(name).suffix in SPEC_SUFFIXES


def check_workload_name(name: str) -> str:
    """``name`` if ``get_workload`` can build it: a registered workload, registered ones joined by
    ``+``, or a spec file, which is loaded and validated now.  Raises ``ValueError`` saying what is
    wrong (``SpecError`` with every problem of a spec; a command line shows it before running)."""
    if is_spec_path(name):
        if not Path(name).is_file():
            raise ValueError(f"no workload spec file at {name}")
        load_spec(Path(name))
        return name
    known = set(WORKLOADS.names())
    unknown = [part for part in name.split(SEPARATOR) if part not in known]
    if unknown:
        raise ValueError(
            f"unknown workload {unknown[0]!r}; choose from {sorted(known)}, join them with {SEPARATOR}, "
            f"or name a spec file ({', '.join(SPEC_SUFFIXES)})"
        )
    return name


def get_workload(name: str, **options: Any) -> Workload:
    """A registered workload by name, a mix of registered ones (``"a+b"``), or a spec file by path
    (``models`` is the only option for the last two)."""
    if SEPARATOR in name and name not in WORKLOADS and not is_spec_path(name):
        return _mix_factory(name, tuple(name.split(SEPARATOR)))(**options)
    if is_spec_path(name) and Path(name).is_file():
        return _spec_factory(Path(name))(**options)
    return WORKLOADS.create(name, **options)
