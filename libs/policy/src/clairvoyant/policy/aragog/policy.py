"""Aragog's routing policies and presets (seeds/002): ``aragog``, ``aragog-per-input`` and
``aragog-per-workflow``, one ``StageScheduler`` (scheduler.py) each, with the configuration-set
strategy (strategies.py) that tells them apart.  Each preset is FCFS priority (the group queues
are the policy's own meta-queue; calls of served models go first come, first served, to the least
used worker), the ``lru`` cache and ``static`` scaling.  Built with no arguments (the registry's
way) a policy has no model groups and behaves as FCFS with least-used routing.
"""

from __future__ import annotations

from collections.abc import Mapping

from clairvoyant.core.model_groups import ModelGroups
from clairvoyant.policy.aragog.scheduler import StageScheduler
from clairvoyant.policy.aragog.strategies import AragogSearch, PerInputChoice, PerWorkflowChoice
from clairvoyant.policy.aragog.types import ConfigRouter, EngineProfile
from clairvoyant.policy.presets import PRESETS, Preset
from clairvoyant.policy.scheduling import ROUTING_POLICIES


@ROUTING_POLICIES.register("aragog")
class AragogRouting(StageScheduler):
    """Aragog (seeds/002 §3): per-workflow configuration sets from the budgeted router search
    (``AragogSearch``), then per-stage model choice by beam search over the meta-queue.
    ``routers``: (group, workflow type) -> router; ``router_call_s``: the (virtual) time of one
    router call, 0 when the router runs at submit and its time is not modelled."""

    def __init__(
        self,
        groups: ModelGroups | None = None,
        routers: Mapping[tuple[str, str], ConfigRouter] | None = None,
        profiles: Mapping[str, EngineProfile] | None = None,
        beam_width: int = 4,
        router_call_s: float = 0.0,
        min_budget_s: float = 0.045,
        queue_ema_alpha: float = 0.1,
        depths: Mapping[tuple[str, str], int] | None = None,
        workflow_idle_ttl_s: float = 600.0,
    ) -> None:
        super().__init__(
            AragogSearch(routers, router_call_s), groups, profiles, beam_width=beam_width, min_budget_s=min_budget_s,
            queue_ema_alpha=queue_ema_alpha, depths=depths, workflow_idle_ttl_s=workflow_idle_ttl_s,
        )  # fmt: skip


@ROUTING_POLICIES.register("aragog-per-input")
class PerInputRouting(StageScheduler):
    """The per-input baseline of §5.1 (``PerInputChoice``) on Aragog's meta-queue."""

    def __init__(
        self,
        groups: ModelGroups | None = None,
        routers: Mapping[tuple[str, str], ConfigRouter] | None = None,
        profiles: Mapping[str, EngineProfile] | None = None,
        beam_width: int = 4,
        depths: Mapping[tuple[str, str], int] | None = None,
        workflow_idle_ttl_s: float = 600.0,
    ) -> None:
        super().__init__(
            PerInputChoice(routers), groups, profiles, beam_width=beam_width, depths=depths,
            workflow_idle_ttl_s=workflow_idle_ttl_s,
        )  # fmt: skip


@ROUTING_POLICIES.register("aragog-per-workflow")
class PerWorkflowRouting(StageScheduler):
    """The per-workflow baseline of §5.1 (``PerWorkflowChoice``) on Aragog's meta-queue.
    ``fixed``: (group, workflow type) -> its one configuration (default c*)."""

    def __init__(
        self,
        groups: ModelGroups | None = None,
        fixed: Mapping[tuple[str, str], int] | None = None,
        profiles: Mapping[str, EngineProfile] | None = None,
        beam_width: int = 4,
        depths: Mapping[tuple[str, str], int] | None = None,
        workflow_idle_ttl_s: float = 600.0,
    ) -> None:
        super().__init__(
            PerWorkflowChoice(fixed), groups, profiles, beam_width=beam_width, depths=depths,
            workflow_idle_ttl_s=workflow_idle_ttl_s,
        )  # fmt: skip


PRESETS.register_preset("aragog", Preset("fcfs", "aragog"))
PRESETS.register_preset("aragog-per-input", Preset("fcfs", "aragog-per-input"))
PRESETS.register_preset("aragog-per-workflow", Preset("fcfs", "aragog-per-workflow"))
