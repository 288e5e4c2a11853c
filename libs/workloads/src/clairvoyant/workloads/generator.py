"""``SpecWorkload``: turns a ``WorkflowSpec`` into workflow programs.

The program is fully pre-sampled: walking the flow once draws every loop and fan-out count, every
branch, every length and tool latency, and emits calls in a topological order.  Dependencies follow
the flow: a step depends on the calls that ended the previous step (its "frontier"); a fan-out or
parallel block starts each branch from the same frontier and ends with the union of the branches'
frontiers, so the next step joins them.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from clairvoyant.workloads.accuracy import InputLabeller
from clairvoyant.workloads.base import AgentStats, ToolStats, Workload, WorkloadStats
from clairvoyant.workloads.distributions import normal_cdf
from clairvoyant.workloads.program import CallTemplate, TemplateSegment, WorkflowProgram, materialize
from clairvoyant.workloads.spec import (
    AgentStep,
    ChooseStep,
    FanoutStep,
    InputRef,
    LoopStep,
    ParallelStep,
    WorkflowSpec,
    expected_calls,
    load_spec,
    max_calls,
)


class SpecWorkload(Workload):
    """A workload defined by a spec (the built-ins are YAML files of this format)."""

    def __init__(self, spec: WorkflowSpec, models: Mapping[str, str] | None = None) -> None:
        super().__init__(spec.models)
        self.spec = spec
        self.name = spec.name
        self.description = spec.description
        if models is not None:
            self._served = self.with_models(models)._served
        self._labeller: InputLabeller | None = None
        self._labeller_models: tuple[tuple[str, str], ...] | None = None  # what it was built for

    @classmethod
    def from_file(
        cls, path: str | Path | Mapping[str, Any], models: Mapping[str, str] | None = None
    ) -> SpecWorkload:
        return cls(load_spec(path), models)

    def instantiate(self, rng: np.random.Generator, workflow_id: str) -> WorkflowProgram:
        builder = _Builder(self.spec, rng)
        builder.run(self.spec.flow, ())
        program = materialize(self.spec.name, workflow_id, builder.templates, self._served)
        labeller = self.input_labeller()
        if labeller is None:
            return program
        # The label has a generator of its own, so that ``rng`` draws what it drew without labels.
        own = np.random.default_rng(zlib.crc32(f"{self.spec.name}/{workflow_id}".encode()))
        return replace(program, input=labeller.label(own))

    def input_labeller(self) -> InputLabeller | None:
        """What labels this workload's inputs (clairvoyant.workloads.accuracy); None when the spec
        has no ``accuracy:`` block.  Built once per mapping of models."""
        if self.spec.accuracy is None:
            return None
        models = tuple(sorted(self._served.items()))
        if models != self._labeller_models:
            self._labeller = InputLabeller.for_workload(self)
            self._labeller_models = models
        return self._labeller

    def stats(self) -> WorkloadStats:
        counts = expected_calls(self.spec.flow)
        agents: dict[str, AgentStats] = {}
        for name, agent in self.spec.agents.items():
            mean, cv = agent.output.moments()
            tools = tuple(ToolStats(t.name, t.p, *t.latency_s.moments()) for t in agent.tools)
            served = self._served.get(agent.model, agent.model)
            agents[name] = AgentStats(name, served, counts.get(name, 0.0), mean, cv, tools)
        return WorkloadStats(self.name, sum(counts.values()), int(max_calls(self.spec.flow)), agents)


class _Builder:
    """Walks the flow once, emitting call templates."""

    def __init__(self, spec: WorkflowSpec, rng: np.random.Generator) -> None:
        self.spec = spec
        self.rng = rng
        self.templates: list[CallTemplate] = []
        self._ancestors: list[int] = []  # bit i set: call i is an ancestor
        self._contains: list[frozenset[tuple[int, str]]] = []  # (call, part) already inside the prompt
        self._latent: list[float] = []  # the normal score behind each output length (correlation)
        self._by_agent: dict[str, list[int]] = {}

    def run(self, steps: list[Any], frontier: tuple[int, ...]) -> tuple[int, ...]:
        for step in steps:
            if isinstance(step, AgentStep):
                frontier = (self._emit(step.agent, frontier),)
            elif isinstance(step, LoopStep):
                for _ in range(step.count.sample_int(self.rng)):
                    frontier = self.run(step.loop, frontier)
            elif isinstance(step, FanoutStep):
                copies = [step.fanout] * step.count.sample_int(self.rng)
                frontier = self._branches(copies, frontier)
            elif isinstance(step, ParallelStep):
                frontier = self._branches(step.parallel, frontier)
            elif isinstance(step, ChooseStep):
                weights = np.array([b.p for b in step.choose])
                pick = int(self.rng.choice(len(weights), p=weights / weights.sum()))
                frontier = self.run(step.choose[pick].do, frontier)
        return frontier

    def _branches(self, branches: list[list[Any]], frontier: tuple[int, ...]) -> tuple[int, ...]:
        ends: list[int] = []
        for branch in branches:
            ends.extend(self.run(branch, frontier))
        return tuple(dict.fromkeys(ends))  # join: union of the branches' ends, order kept

    def _last_ancestor(self, agents: list[str], ancestors: int) -> int | None:
        best: int | None = None
        for agent in agents:
            for i in reversed(self._by_agent.get(agent, ())):
                if ancestors >> i & 1:
                    best = i if best is None else max(best, i)
                    break
        return best

    def _select(self, ref: InputRef, ancestors: int, deps: tuple[int, ...]) -> list[int]:
        names = ref.agents
        if ref.select == "last":
            last = self._last_ancestor(names, ancestors)
            return [] if last is None else [last]
        if ref.select == "deps":
            return [d for d in deps if self.templates[d].agent_id in names]
        return sorted(i for a in names for i in self._by_agent.get(a, ()) if ancestors >> i & 1)

    def _emit(self, name: str, deps: tuple[int, ...]) -> int:
        agent = self.spec.agents[name]
        rng = self.rng
        ancestors = 0
        for d in deps:
            ancestors |= (1 << d) | self._ancestors[d]
        previous = self._last_ancestor([name], ancestors)
        keep = agent.prompt.keep_context
        if keep == "chain":  # only a direct dependency of the same agent continues
            same = [d for d in deps if self.templates[d].agent_id == name]
            previous = max(same) if same else None

        prompt: list[TemplateSegment] = []
        contains: set[tuple[int, str]] = set()
        if keep and previous is not None:
            before = self.templates[previous]
            prompt += [
                ("call", previous, "prompt", before.prompt_tokens),
                ("call", previous, "response", before.output_tokens),
            ]
            contains |= self._contains[previous] | {(previous, "prompt"), (previous, "response")}
        elif agent.system_tokens:
            prompt.append(("system", name, agent.system_tokens))
        for ref in agent.prompt.inputs:
            for source in self._select(ref, ancestors, deps):
                if (source, ref.part) in contains:
                    continue
                t = self.templates[source]
                tokens = t.prompt_tokens if ref.part == "prompt" else t.output_tokens
                tokens = min(tokens, ref.max_tokens or tokens)
                prompt.append(("call", source, ref.part, tokens))
                contains.add((source, ref.part))
                if ref.part == "prompt":
                    contains |= self._contains[source]
        fresh = agent.prompt.first_new if previous is None and agent.prompt.first_new else agent.prompt.new
        new_tokens = fresh.sample_int(rng)
        if new_tokens > 0 or not prompt:
            prompt.append(("new", max(new_tokens, 1)))

        # Output length; consecutive calls of an agent correlate through a Gaussian copula.
        rho = agent.output_correlation
        latent = float(rng.standard_normal())
        if rho and previous is not None:
            latent = rho * self._latent[previous] + math.sqrt(1 - rho * rho) * latent
        output = max(1, agent.output.sample_int(rng, normal_cdf(latent)))

        tool, latency = None, 0.0
        if agent.tools:
            u, total = rng.random(), 0.0
            for spec_tool in agent.tools:
                total += spec_tool.p
                if u < total:
                    tool, latency = spec_tool.name, spec_tool.latency_s.sample(rng)
                    break

        index = len(self.templates)
        self.templates.append(
            CallTemplate(
                name, agent.model, tuple(prompt), output, deps, tool, latency, tuple(agent.alternatives)
            )
        )
        self._ancestors.append(ancestors)
        self._contains.append(frozenset(contains))
        self._latent.append(latent)
        self._by_agent.setdefault(name, []).append(index)
        return index
