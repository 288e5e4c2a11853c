"""Per-input difficulty and accuracy labels of workflows whose agents may run on several models
(Aragog, seeds/002 §3.1), so that configuration routers can be trained and scored, and accuracy
reported, in the simulator.  docs/workloads.md ("Accuracy labels (Aragog)") has the calibration.

A workload whose spec has an ``accuracy:`` block labels each workflow with a ``WorkflowInput``: the
input's text, class and difficulty, and the configurations (``config_space``) that answer it right.

Configurations: one model per *agent*, whatever its number of calls: task_decomposition's 3-6 solver
calls all run on the solver's model, text_to_sql's second refinement on the refinement's model.

The labels (``InputLabeller``):

- a model's capability is its log parameter count scaled to [0, 1] over the space's models (7B 0,
  14B 0.46, 32B 1); a configuration's strength is the weighted mean of its agents' capabilities,
  downstream agents weighing more (Figure 2: later stages correct earlier errors);
- its target accuracy is ``base + (reference - base) * strength + offset``; the offset is small,
  fixed per configuration (0 for the base and the reference) and seeded by the workload's name: it
  makes a few upgrades lose a little accuracy, as in Figure 7;
- an input draws its class, a difficulty ``d ~ Beta`` of the class and ``u``, d's percentile over
  the workload's inputs; configuration c is correct iff ``u + answer_noise * z_c <= target(c)``
  (``z_c`` standard normal per input and configuration), so c's dataset accuracy is ``target(c)``;
- the text shows ``d`` blurred by ``hidden_difficulty``: the part no router can learn.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from clairvoyant.core.configspace import ConfigSpace
from clairvoyant.workloads.errors import WorkloadError
from clairvoyant.workloads.spec import AgentStep, ChooseStep, FanoutStep, LoopStep, ParallelStep, WorkflowSpec

if TYPE_CHECKING:
    from clairvoyant.workloads.generator import SpecWorkload

_PARAMETERS = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)b(?![a-z])", re.IGNORECASE)  # "qwen2.5-14b" -> 14
_DIFFICULTY_SAMPLE = 1 << 15  # draws behind an input's difficulty percentile
_TOPIC_WORDS = 12  # per class
_DETAIL_WORDS = 24  # ordered by difficulty
_FILLER_WORDS = 300


class InputClass(NamedTuple):
    name: str
    share: float  # probability of the class
    difficulty: float  # mean of its Beta-distributed difficulty
    concentration: float  # a + b of that Beta


class AccuracyModel(NamedTuple):
    """The calibration of one workload's labels (the spec's ``accuracy:`` block, defaults resolved).
    The YAML files give each number's source or mark it assumed."""

    reference_accuracy: float  # c*: every agent on its most expensive model
    base_accuracy: float  # every agent on its cheapest model
    weights: Mapping[str, float]  # agent -> weight in the strength (default: 1 + deepest depth - its depth)
    classes: tuple[InputClass, ...]
    hidden_difficulty: float  # sd of the difficulty the text does not show
    answer_noise: float  # sd of a configuration's per-input luck, in percentiles of difficulty
    perturbation: float  # sd of the per-configuration accuracy offsets
    tolerance: float = 0.02  # accurate: a chance of a right answer within this of c*'s


@dataclass(frozen=True)
class WorkflowInput:
    """One workflow's input and its labels.  Configurations are numbered as in ``config_space``."""

    text: str  # the input as an application would send it (unique: it starts with an id token)
    input_class: str
    difficulty: float  # in [0, 1]
    correct: int  # mask of the configurations whose answer is right (one run of each)
    configurations: int  # the size of the configuration space (the reference is the last)
    # Per configuration, the chance that a run answers right (the expected accuracy on this input);
    # empty: only ``correct`` is known.
    success: tuple[float, ...] = ()
    tolerance: float = 0.0  # accurate: a chance of a right answer within this of c*'s

    @property
    def reference_correct(self) -> bool:
        return bool(self.correct >> (self.configurations - 1) & 1)

    @cached_property
    def accurate(self) -> int:
        """The configurations as accurate as c* on this input (§3.1: "equivalent accuracy to c*").
        With ``success``: those whose chance of a right answer is at least c*'s less ``tolerance``
        (the accuracy of a configuration on one input is the share of its runs that answer right,
        as an offline profile of several runs per configuration measures it).  Without: the
        correct ones when c* is right; every one when c* is wrong, since none can do worse."""
        if self.success:
            bar = self.success[-1] - self.tolerance
            return sum(1 << c for c, chance in enumerate(self.success) if chance >= bar)
        return self.correct if self.reference_correct else (1 << self.configurations) - 1

    def expected_accuracy(self, config: int) -> float:
        """The chance that ``config`` answers this input right (its one run's outcome without
        ``success``)."""
        return self.success[config] if self.success else float(self.correct >> config & 1)


class UpgradeDrop(NamedTuple):
    lower: int  # a configuration
    upper: int  # one agent moved to its next, more expensive model
    drop: float  # accuracy lost by the upgrade (> 0)


def model_costs(workload: SpecWorkload) -> dict[str, float]:
    """Served model -> parameters in billions, read from its name ("qwen2.5-14b" -> 14.0)."""
    costs: dict[str, float] = {}
    for model in workload.served_models():
        found = _PARAMETERS.findall(model)
        if not found:
            raise WorkloadError(f"{workload.name}: no parameter count (such as '14b') in model name {model!r}")
        costs[model] = float(found[-1])
    return costs


def config_space(workload: SpecWorkload) -> ConfigSpace | None:
    """The agents in flow order (first appearance), each on its ``alternatives`` then its ``model``
    (served names; the spec lists them cheapest first, the model being c*'s); None when no agent
    has alternatives."""
    spec = workload.spec
    agents, _ = _agent_graph(spec)
    if not any(spec.agents[name].alternatives for name in agents):
        return None
    served = workload.models
    options = []
    for name in agents:
        agent = spec.agents[name]
        names = [served.get(alias, alias) for alias in (*agent.alternatives, agent.model)]
        options.append(tuple(dict.fromkeys(names)))
    return ConfigSpace(spec.name, tuple(agents), tuple(options))


def agent_depths(workload: SpecWorkload) -> dict[str, int]:
    """Agent -> the longest path from it to a leaf of the workflow's agent graph (Aragog §3.2,
    "Supporting complex workflows"), in flow order."""
    order, successors = _agent_graph(workload.spec)
    depth: dict[str, int] = {}
    for agent in reversed(order):  # every edge points to a later agent
        depth[agent] = max((depth[after] + 1 for after in successors[agent]), default=0)
    return {agent: depth[agent] for agent in order}


def _agent_graph(spec: WorkflowSpec) -> tuple[list[str], dict[str, set[str]]]:
    """Agents in order of first appearance, and agent -> the agents whose calls follow its calls.
    An edge back to an agent that appeared earlier (a loop's next round, a repeated refinement)
    is dropped, so the graph is acyclic."""
    order: dict[str, int] = {}
    successors: dict[str, set[str]] = {}

    def walk(steps: Sequence[object], frontier: frozenset[str]) -> frozenset[str]:
        for step in steps:
            if isinstance(step, AgentStep):
                order.setdefault(step.agent, len(order))
                successors.setdefault(step.agent, set())
                for before in frontier:
                    if order[before] < order[step.agent]:
                        successors[before].add(step.agent)
                frontier = frozenset((step.agent,))
            elif isinstance(step, LoopStep):
                end = walk(step.loop, frontier)
                frontier = end | frontier if step.count.support()[0] < 1 else end
            elif isinstance(step, FanoutStep):
                frontier = walk(step.fanout, frontier)
            elif isinstance(step, ParallelStep):
                frontier = frozenset().union(*(walk(branch, frontier) for branch in step.parallel))
            elif isinstance(step, ChooseStep):
                frontier = frozenset().union(*(walk(branch.do, frontier) for branch in step.choose))
        return frontier

    walk(spec.flow, frozenset())
    return list(order), successors


def accuracy_model(workload: SpecWorkload) -> AccuracyModel | None:
    """The workload's calibration; None when its spec has no ``accuracy:`` block."""
    block = workload.spec.accuracy
    if block is None:
        return None
    depths = agent_depths(workload)
    deepest = max(depths.values())
    return AccuracyModel(
        reference_accuracy=block.reference_accuracy,
        base_accuracy=block.base_accuracy,
        weights={agent: block.weights.get(agent, 1.0 + deepest - depth) for agent, depth in depths.items()},
        classes=tuple(InputClass(c.name, c.share, c.difficulty, c.concentration) for c in block.classes),
        hidden_difficulty=block.hidden_difficulty,
        answer_noise=block.answer_noise,
        perturbation=block.perturbation,
        tolerance=block.tolerance,
    )


class InputLabeller:
    """Draws the labelled inputs of one workload (the model is in the module docstring)."""

    def __init__(self, name: str, space: ConfigSpace, model: AccuracyModel, costs: Mapping[str, float]) -> None:
        self.space = space
        self.model = model
        self.strength = self._strength(costs)  # per configuration, in [0, 1]
        self.target_accuracy = self._targets(name)  # per configuration: its dataset accuracy
        shares = np.array([c.share for c in model.classes])
        self._shares = shares / shares.sum()
        self._betas = [(c.difficulty * c.concentration, (1 - c.difficulty) * c.concentration) for c in model.classes]
        # A fixed sample of the workload's difficulties: an input's percentile is its rank in it.
        reference = np.random.default_rng(zlib.crc32(f"{name}/difficulty".encode()))
        counts = reference.multinomial(_DIFFICULTY_SAMPLE, self._shares)
        draws = [reference.beta(a, b, n) for (a, b), n in zip(self._betas, counts, strict=True)]
        self._difficulties = np.sort(np.concatenate(draws))

    @classmethod
    def for_workload(cls, workload: SpecWorkload) -> InputLabeller | None:
        """None when the workload's spec has no ``accuracy:`` block."""
        model = accuracy_model(workload)
        space = config_space(workload)
        if model is None or space is None:
            return None
        return cls(workload.name, space, model, model_costs(workload))

    def _strength(self, costs: Mapping[str, float]) -> np.ndarray:
        """Per configuration: the weighted mean of its agents' capabilities."""
        space = self.space
        sizes = [costs[m] for options in space.options for m in options]
        low, high = min(sizes), max(sizes)
        levels = np.array([space.levels(c) for c in range(space.size)])
        total = np.zeros(space.size)
        for i, agent in enumerate(space.agents):
            capability = np.array(
                [np.log(costs[m] / low) / np.log(high / low) if high > low else 1.0 for m in space.options[i]]
            )
            total += self.model.weights[agent] * capability[levels[:, i]]
        return total / sum(self.model.weights[agent] for agent in space.agents)

    def _targets(self, name: str) -> np.ndarray:
        model = self.model
        offsets = np.random.default_rng(zlib.crc32(f"{name}/offsets".encode())).normal(
            0.0, model.perturbation, self.space.size
        )
        offsets[[self.space.base, self.space.reference]] = 0.0
        gap = model.reference_accuracy - model.base_accuracy
        return np.clip(model.base_accuracy + gap * self.strength + offsets, 0.0, 1.0)

    def label(self, rng: np.random.Generator) -> WorkflowInput:
        """One input, every random draw from ``rng``."""
        model = self.model
        k = int(rng.choice(len(self._shares), p=self._shares))
        difficulty = float(rng.beta(*self._betas[k]))
        shown = float(np.clip(difficulty + model.hidden_difficulty * rng.standard_normal(), 0.0, 1.0))
        percentile = np.searchsorted(self._difficulties, difficulty) / len(self._difficulties)
        luck = rng.standard_normal(self.space.size)
        right = percentile + model.answer_noise * luck <= self.target_accuracy
        correct = int.from_bytes(np.packbits(right, bitorder="little").tobytes(), "little")
        # P(percentile + answer_noise * z <= target): the chance of the run above, per configuration.
        margin = (self.target_accuracy - percentile) / max(model.answer_noise, 1e-12)
        success = tuple(round(0.5 * math.erfc(-m / math.sqrt(2)), 6) for m in margin.tolist())
        return WorkflowInput(
            text=self._text(rng, model.classes[k].name, shown),
            input_class=model.classes[k].name,
            difficulty=difficulty,
            correct=correct,
            configurations=self.space.size,
            success=success,
            tolerance=model.tolerance,
        )

    @staticmethod
    def _text(rng: np.random.Generator, topic: str, shown: float) -> str:
        """An id token, then shuffled: 3-6 words of the topic, "detail" words whose number and kind
        grow with the shown difficulty, and filler."""
        words = [f"{topic}_{j}" for j in rng.integers(0, _TOPIC_WORDS, size=int(rng.integers(3, 7)))]
        centre = shown * (_DETAIL_WORDS - 1)
        for z in rng.standard_normal(1 + round(6 * shown) + int(rng.integers(0, 2))):
            words.append(f"detail{int(np.clip(round(centre + 2 * z), 0, _DETAIL_WORDS - 1))}")
        words += [f"w{j}" for j in rng.integers(0, _FILLER_WORDS, size=int(rng.integers(6, 15)))]
        order = rng.permutation(len(words))
        return f"q{int(rng.integers(1 << 62)):016x} " + " ".join(words[i] for i in order)


def label_input(workload: SpecWorkload, rng: np.random.Generator) -> WorkflowInput:
    """A labelled input of ``workload``; raises ``WorkloadError`` when it has no accuracy model."""
    labeller = workload.input_labeller()
    if labeller is None:
        raise WorkloadError(f"workload {workload.name!r} has no accuracy model (an accuracy: block)")
    return labeller.label(rng)


def labelled_inputs(workload: SpecWorkload, count: int, seed: int) -> list[WorkflowInput]:
    """A dataset: ``count`` labelled inputs drawn from one generator seeded with ``seed``."""
    rng = np.random.default_rng(seed)
    return [label_input(workload, rng) for _ in range(count)]


def mask_bits(masks: Sequence[int], size: int) -> np.ndarray:
    """Bit masks of configurations as a (len(masks), size) boolean array."""
    width = (size + 7) // 8
    raw = np.frombuffer(b"".join(m.to_bytes(width, "little") for m in masks), dtype=np.uint8)
    return np.unpackbits(raw.reshape(len(masks), width), axis=1, bitorder="little")[:, :size].astype(bool)


def dataset_accuracy(inputs: Sequence[WorkflowInput]) -> np.ndarray:
    """Per configuration: its expected accuracy over ``inputs`` (the mean chance of a right answer;
    the fraction it answered right in its one run when the inputs carry no chances)."""
    if all(i.success for i in inputs):
        return np.array([i.success for i in inputs]).mean(axis=0)
    return mask_bits([i.correct for i in inputs], inputs[0].configurations).mean(axis=0)


def upgrade_drops(space: ConfigSpace, accuracy: np.ndarray) -> list[UpgradeDrop]:
    """The single-agent upgrades (Figure 7's edges) that lose accuracy."""
    return [
        UpgradeDrop(lower, upper, float(accuracy[lower] - accuracy[upper]))
        for lower in range(space.size)
        for upper in space.upgrades(lower)
        if accuracy[upper] < accuracy[lower]
    ]
