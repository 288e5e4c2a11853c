"""The actuator contract: how the autoscaler starts and stops worker replicas on one platform.

A replica is one worker (``python -m clairvoyant.worker``) serving one model.  It becomes routable
when its heartbeats reach the scheduler under its worker id; the actuator only launches and stops
it, and never waits for it to become ready.
"""

from __future__ import annotations

import re
from typing import Protocol

from clairvoyant.autoscaler.core.replicas import is_pending as is_pending
from clairvoyant.autoscaler.core.replicas import pending_id as pending_id
from clairvoyant.core.registry import Registry


class ActuatorError(Exception):
    """A platform call failed (engine or API server unreachable, refused, timed out).  The
    service retries the action with backoff; the message says what was attempted and why it failed."""


class Actuator(Protocol):
    """Starts and stops replicas of models on one platform (local processes, Docker, Kubernetes).

    Every method may raise ``ActuatorError`` and nothing else for a platform failure; a method that
    raised left at most the one replica it was acting on half-started or half-stopped, which
    ``running()`` then shows as it is.  Methods are safe to call concurrently from one event loop,
    and none blocks it for long.
    """

    name: str  # the registry name: "local", "docker", "kubernetes"

    async def provision(self, model: str) -> str:
        """Start one replica of ``model``; return once it is launched, not once it is ready.

        Returns the worker id the replica will heartbeat under, or ``pending:<model>:<n>`` where
        the platform names it later (Kubernetes: a pod of the model's Deployment; ``n`` counts this
        actuator's provisions of ``model`` from 1, so pending ids are unique while it lives)."""
        ...

    async def release(self, replica_id: str, model: str) -> None:
        """Stop the replica ``replica_id`` of ``model`` (drained beforehand by the caller).

        Idempotent: releasing a replica twice, one already gone, or an id this actuator never
        returned is not an error and stops nothing else.  A ``pending:`` id stops some replica of
        ``model`` that has not been named yet."""
        ...

    async def running(self) -> dict[str, str]:
        """Replica id -> model of every replica this actuator runs now: launched and not yet
        released or exited, ready or not.  Kubernetes names pods here, never ``pending:`` ids."""
        ...

    async def close(self) -> None:
        """Stop everything this actuator started (local processes, Docker containers), or nothing
        where the platform keeps replicas on its own (Kubernetes).  Further calls are not allowed."""
        ...


# name -> factory(**options); the service picks one by its configured name.
ACTUATORS: Registry[Actuator] = Registry("actuator")



def model_slug(model: str) -> str:
    """``model`` as a DNS-1123 label part (``llama-3.1-8b`` -> ``llama-3-1-8b``): lower case,
    every run of other characters one ``-``; usable in container, pod and Deployment names."""
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")
    if not slug:
        raise ValueError(f"model name {model!r} has no letters or digits to name a replica by")
    return slug
