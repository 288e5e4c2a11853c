"""What a policy can do beyond its family's one or two methods, declared in one place.

A policy class lists its capabilities in a class attribute, ``capabilities``, a frozenset of
``Capability``.  Each capability names one hook method the policy then implements; the scheduler
calls a hook only when the capability is declared, and never probes types.  ``PolicyRegistry``
checks the declaration against the methods when a class registers (and, for a factory function,
when it first builds a policy): a declared hook that is missing, or a hook method that is not
declared (it would silently never be called), is an error.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TypeVar

from clairvoyant.core.registry import Registry

T = TypeVar("T")


class Capability(enum.Enum):
    """Each member's value is the hook method the policy implements."""

    PROGRAM_AWARE = "bind_programs"  # reads the scheduler's process table
    SCHEDULER_AWARE = "bind_scheduler"  # reads the scheduler's queues and placements (SchedulerView)
    FIXED_PRIORITY = "priority_is_fixed"  # a request's priority never changes while it waits
    INCREMENTAL_PRIORITY = "priority_changes"  # priorities change only with events it names
    ENGINE_RULE = "engine_rule"  # hands each engine a local rule (Autellix's K queues, aging)
    ENGINE_QUEUED = "engine_queue_factor"  # lets placements queue at the engines (factor x batch)
    OBSERVES_WORKERS = "observe_worker"  # sees every worker report as it arrives
    REBALANCES = "rebalance"  # re-pins queued calls before each dispatch (work stealing)
    MIGRATES_KV = "kv_source"  # names where a placed call's KV should come from
    KV_AWARE = "bind_kv_index"  # reads the workers' reported KV blocks (KvIndexView)
    ASSIGNS_MODELS = "assign"  # places the calls of model groups, choosing each call's model (Aragog)
    WAKES = "wake_at"  # names a time dispatch must run at even if nothing else happens
    ADMITS = "admission_limit"  # caps the placements held on each worker (late binding at the knee)
    BACKFILLS = "backfill"  # lets dispatch pass over calls that do not fit, within a bound


HOOKS = frozenset(capability.value for capability in Capability)


def capabilities_of(policy: object) -> frozenset[Capability]:
    """The capabilities ``policy`` (an instance or a class) declares; none when it declares none."""
    declared: frozenset[Capability] = frozenset(getattr(policy, "capabilities", ()))
    return declared


def check_capabilities(cls: type) -> None:
    """Raise TypeError unless ``cls`` implements exactly the hooks its ``capabilities`` declare."""
    declared = capabilities_of(cls)
    missing = sorted(c.value for c in declared if not callable(getattr(cls, c.value, None)))
    if missing:
        raise TypeError(f"{cls.__name__} declares capabilities without their methods: {', '.join(missing)}")
    undeclared = sorted(h for h in HOOKS if callable(getattr(cls, h, None)) and Capability(h) not in declared)
    if undeclared:
        raise TypeError(
            f"{cls.__name__} implements hooks it does not declare in `capabilities` "
            f"(they would never be called): {', '.join(undeclared)}"
        )


class PolicyRegistry(Registry[T]):
    """A registry of policies whose capability declarations are checked (``check_capabilities``)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self._checked: set[type] = set()

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        add = super().register(name)

        def checked(factory: Callable[..., T]) -> Callable[..., T]:
            if isinstance(factory, type):
                self._check(factory)
            return add(factory)

        return checked

    def create(self, name: str, **kwargs: object) -> T:
        policy = super().create(name, **kwargs)
        self._check(type(policy))
        return policy

    def _check(self, cls: type) -> None:
        if cls not in self._checked:
            check_capabilities(cls)
            self._checked.add(cls)
