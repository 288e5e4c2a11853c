"""The engine-side part of a preset: its local rule, from the shared policy package.

A preset's priority policy that declares ``ENGINE_RULE`` (Autellix's K queues, Pythia's aging)
hands out a fresh ``LocalRule`` per engine.  The simulator installs it on each replica; a live
worker learns the preset from the requests (``GenerateRequest.scheduler_preset``, which the
gateway copies from the placement), so switching a running stack's preset takes a scheduler
restart and nothing else.  Both build it with ``clairvoyant.policy.build_engine_rule``.
"""

from __future__ import annotations

import logging

from clairvoyant.policy import PRESETS, build_engine_rule
from clairvoyant.worker.core.scheduler import PriorityRule

logger = logging.getLogger(__name__)


def preset_rule(preset: str) -> PriorityRule | None:
    """A fresh engine rule of ``preset``; None when it has none (base priority + the worker's
    aging) or is unknown here, e.g. a scheduler newer than this worker.  The engine's scheduler
    calls this once per preset (``Scheduler.follow_preset``), so an unknown name is logged once."""
    if preset not in PRESETS:
        logger.warning("unknown scheduler preset %r: ranking by base priority; known: %s", preset, PRESETS.names())
        return None
    rule = build_engine_rule(preset)
    logger.info("scheduler preset %s: engine rule %s", preset, type(rule).__name__ if rule else "none (base priority)")
    return rule
