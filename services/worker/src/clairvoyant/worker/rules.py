"""The engine-side half of a scheduler preset: its rule, built from the scheduler's policy registry.

A preset is a pair of scheduler policies; a priority policy with an engine-side counterpart
(``EngineRanked``: Autellix's K queues, Pythia's aging) hands out a fresh ``LocalRule`` per engine.
The simulator installs it on each replica; a live worker learns the preset from the requests
(``GenerateRequest.scheduler_preset``, which the gateway copies from the placement), so switching
a running stack's preset takes a scheduler restart and nothing else.  The worker imports the
scheduler's pure ``core`` package (no I/O, no service code runs) so that one registry defines a
preset everywhere; the scheduler package adds no third-party dependency the worker lacks.
"""

from __future__ import annotations

import logging

from clairvoyant.scheduler.core.policies import PRESETS, PRIORITY_POLICIES, EngineRanked
from clairvoyant.worker.core.scheduler import PriorityRule

logger = logging.getLogger(__name__)


def preset_rule(preset: str) -> PriorityRule | None:
    """A fresh engine rule of ``preset``; None when it has none (base priority + the worker's
    aging) or is unknown here, e.g. a scheduler newer than this worker.  The engine's scheduler
    calls this once per preset (``Scheduler.follow_preset``), so an unknown name is logged once."""
    if preset not in PRESETS:
        logger.warning("unknown scheduler preset %r: ranking by base priority; known: %s", preset, PRESETS.names())
        return None
    policy = PRIORITY_POLICIES.create(PRESETS.create(preset).priority)
    rule = policy.engine_rule() if isinstance(policy, EngineRanked) else None
    logger.info("scheduler preset %s: engine rule %s", preset, type(rule).__name__ if rule else "none (base priority)")
    return rule
