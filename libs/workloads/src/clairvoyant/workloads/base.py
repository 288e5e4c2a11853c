"""The ``Workload`` interface that drivers and the simulator consume, and its configured statistics."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from clairvoyant.workloads.program import WorkflowProgram


@dataclass(frozen=True)
class ToolStats:
    name: str
    probability: float  # chance the tool runs after a call of the agent
    latency_mean_s: float
    latency_cv: float


@dataclass(frozen=True)
class AgentStats:
    agent_id: str
    model: str  # served model name
    calls_per_workflow: float  # expected number of this agent's calls in one workflow
    output_mean: float  # output tokens per call
    output_cv: float
    tools: tuple[ToolStats, ...] = ()


@dataclass(frozen=True)
class WorkloadStats:
    """What a workload is configured to produce; generated programs converge to it."""

    workload: str
    calls_per_workflow: float  # expected calls per workflow
    max_calls_per_workflow: int  # the most a workflow can make (loop and fan-out bounds)
    agents: dict[str, AgentStats]


class Workload(ABC):
    """A generator of workflow programs.

    Contract: ``instantiate`` draws every random choice from ``rng`` and nothing else, so one seed
    gives identical programs; the program it returns passes ``check_integrity()``.  Programs are
    fully pre-sampled static DAGs: loop and fan-out counts, branch choices, token lengths and tool
    latencies are all drawn up front, before the driver issues the first call.
    """

    name: str
    description: str = ""

    def __init__(self, models: Mapping[str, str]) -> None:
        self._served = dict(models)

    @abstractmethod
    def instantiate(self, rng: np.random.Generator, workflow_id: str) -> WorkflowProgram: ...

    @abstractmethod
    def stats(self) -> WorkloadStats: ...

    @property
    def models(self) -> dict[str, str]:
        """Model alias (as the spec or trace names it) -> served model name."""
        return dict(self._served)

    def served_models(self) -> list[str]:
        return sorted(set(self._served.values()))

    def with_models(self, mapping: Mapping[str, str] | str) -> Workload:
        """A copy serving its aliases on other models: a mapping of alias -> served name (aliases not
        named keep theirs), or one served name for every alias (a one-model test cluster)."""
        other = copy.copy(self)
        if isinstance(mapping, str):
            other._served = {alias: mapping for alias in self._served}
        else:
            unknown = set(mapping) - set(self._served)
            if unknown:
                raise ValueError(
                    f"{self.name}: unknown model aliases {sorted(unknown)}; known: {sorted(self._served)}"
                )
            other._served = {**self._served, **mapping}
        return other
