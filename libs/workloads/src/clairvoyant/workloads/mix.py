"""Several workloads served together on one cluster (Kairos' co-located applications).

``MixWorkload`` draws, for each workflow instance, which component it is (with the rng, by the
components' weights), then lets that component instantiate it from the same rng.  So arrivals of
the components interleave, in an order fixed by the seed, and each program keeps its component's
``workflow_type``: the profiler and the program-level policies see the applications apart, as they
would if the applications shared a gateway.

    get_workload("kairos_mix")                                 # qa_router + report_generate + code_generate
    get_workload("qa_router+report_generate+code_generate")    # the same mix, spelled out

Model aliases are qualified by the component (``"qa_router.llm"``), so two components may map the
same alias to different served models.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from clairvoyant.workloads.base import AgentStats, Workload, WorkloadStats
from clairvoyant.workloads.program import WorkflowProgram

SEPARATOR = "+"


class MixWorkload(Workload):
    """Instances of ``components``, each drawn with probability weight / sum(weights)."""

    def __init__(self, name: str, components: Sequence[Workload], weights: Sequence[float] | None = None) -> None:
        if len(components) < 2:
            raise ValueError(f"{name}: a mix needs at least two workloads, got {len(components)}")
        names = [c.name for c in components]
        if len(set(names)) != len(names):
            raise ValueError(f"{name}: a workload appears twice in {names}")
        weights = [1.0] * len(components) if weights is None else list(weights)
        if len(weights) != len(components) or min(weights) <= 0:
            raise ValueError(f"{name}: need one positive weight per workload, got {weights}")
        self.name = name
        self.description = "served together: " + ", ".join(names)
        self.components = tuple(components)
        total = sum(weights)
        self.shares = np.array([w / total for w in weights])
        super().__init__(self._qualified_models())

    def _qualified_models(self) -> dict[str, str]:
        return {f"{c.name}.{alias}": served for c in self.components for alias, served in c.models.items()}

    def instantiate(self, rng: np.random.Generator, workflow_id: str) -> WorkflowProgram:
        component = self.components[int(rng.choice(len(self.components), p=self.shares))]
        return component.instantiate(rng, workflow_id)

    def stats(self) -> WorkloadStats:
        """Per workflow of the mix: each component's expected calls weighted by its share; agents
        keyed ``component/agent``."""
        agents: dict[str, AgentStats] = {}
        calls = 0.0
        for share, component in zip(self.shares, self.components, strict=True):
            stats = component.stats()
            calls += float(share) * stats.calls_per_workflow
            for agent_id, agent in stats.agents.items():
                agents[f"{component.name}/{agent_id}"] = replace(
                    agent, calls_per_workflow=float(share) * agent.calls_per_workflow
                )
        most = max(c.stats().max_calls_per_workflow for c in self.components)
        return WorkloadStats(self.name, calls, most, agents)

    def with_models(self, mapping: Mapping[str, str] | str) -> Workload:
        """As ``Workload.with_models``, with qualified aliases (``"qa_router.llm"``)."""
        if isinstance(mapping, str):
            components = [c.with_models(mapping) for c in self.components]
        else:
            unknown = set(mapping) - set(self._served)
            if unknown:
                raise ValueError(f"{self.name}: unknown model aliases {sorted(unknown)}; known: {sorted(self._served)}")
            components = []
            for c in self.components:
                prefix = f"{c.name}."
                mine = {k.removeprefix(prefix): v for k, v in mapping.items() if k.startswith(prefix)}
                components.append(c.with_models(mine) if mine else c)
        other = copy.copy(self)
        other.components = tuple(components)
        other._served = other._qualified_models()
        return other
