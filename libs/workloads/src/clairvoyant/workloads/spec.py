"""The workflow spec: a small YAML/JSON format for multi-agent workloads, and its validation.

A spec names model aliases, agents and a flow (see docs/workloads.md for the full format)::

    name: tiny
    models: {llm: llama-3.1-8b}
    agents:
      router: {model: llm, system_tokens: 300, prompt: {new: {mean: 80, cv: 0.5}}, output: {mean: 12, cv: 0.3}}
      expert: {model: llm, system_tokens: 500, prompt: {new: 80}, output: {mean: 400, cv: 0.5}}
    flow:
      - agent: router
      - choose: [{p: 0.7, do: [{agent: expert}]}, {p: 0.3, do: []}]

Flow steps: ``{agent}`` one call; ``{loop: [steps], count}`` sequential repetition;
``{fanout: [steps], count}`` that many parallel copies, joined before the next step;
``{parallel: [[steps], [steps]]}`` distinct parallel branches, joined; ``{choose: [{p, do}]}`` a
probabilistic transition to exactly one branch.  Counts need a finite bound: loops are bounded.

``load_spec`` raises ``SpecError`` whose message names each offending path, e.g.
``agents.engineer.output.cv: must be >= 0`` or ``flow[2].agent: unknown agent 'enginer'``.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from clairvoyant.workloads.distributions import DIST_TAG_PREFIX, Constant, Distribution
from clairvoyant.workloads.errors import SpecError

MAX_CALLS_PER_WORKFLOW = 100_000
STEP_KINDS = ("agent", "loop", "fanout", "parallel", "choose")
_STEP_TAG_PREFIX = "step:"
_Name = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]*$")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolSpec(_Model):
    """A tool (or human) interrupt after the agent's call; dependents wait for it."""

    name: str
    p: float = Field(default=1.0, gt=0, le=1)  # probability it runs after a given call
    latency_s: Distribution


class InputRef(_Model):
    """Part of the prompt taken from earlier calls of the same workflow.  Only ancestors of the
    call (calls it transitively depends on) are candidates; when there is none, nothing is added."""

    agent: list[str] = Field(min_length=1)  # the agent(s) whose calls are taken; one name is a list of one
    part: Literal["prompt", "response"] = "response"
    select: Literal["last", "deps", "all"] = "last"  # latest ancestor | direct dependencies | all ancestors
    max_tokens: int | None = Field(default=None, ge=1)  # take only the first max_tokens tokens

    @field_validator("agent", mode="before")
    @classmethod
    def _one_name(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @property
    def agents(self) -> list[str]:
        return self.agent


class PromptSpec(_Model):
    """How an agent's prompt is composed.  With ``keep_context`` the agent continues its own
    conversation: the prompt starts with the whole prompt and response of its previous call (instead
    of the system prompt).  ``true`` continues the latest ancestor call of the same agent (a
    decomposer across turns); ``chain`` only a direct dependency of the same agent (a ReAct loop
    inside one fan-out branch starts afresh in the next fan-out).  Then come ``inputs`` (skipping
    content the continued context already holds), then ``new`` fresh tokens (``first_new`` on the
    agent's first call in the workflow, when given)."""

    keep_context: Literal[False, True, "chain"] = False
    inputs: list[InputRef] = []
    new: Distribution = Constant(value=0)
    first_new: Distribution | None = None


class AgentSpec(_Model):
    model: str  # an alias from the spec's models
    alternatives: list[str] = []  # other model aliases that may run this agent (Aragog)
    system_tokens: int = Field(default=0, ge=0)
    prompt: PromptSpec = PromptSpec()
    output: Distribution
    output_correlation: float = Field(default=0.0, ge=0, lt=1)  # between consecutive calls of the agent
    tools: list[ToolSpec] = []  # at most one runs after a call, picked by p
    description: str = ""

    @model_validator(mode="after")
    def _tools(self) -> AgentSpec:
        total = sum(t.p for t in self.tools)
        if total > 1 + 1e-9:
            raise ValueError(f"tool probabilities sum to {total:g}, must be <= 1")
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError("tool names must be unique")
        return self


class AgentStep(_Model):
    agent: str


class LoopStep(_Model):
    loop: list[Step]
    count: Distribution


class FanoutStep(_Model):
    fanout: list[Step] = Field(min_length=1)
    count: Distribution


class ParallelStep(_Model):
    parallel: list[list[Step]] = Field(min_length=1)


class Branch(_Model):
    p: float = Field(ge=0, le=1)
    do: list[Step] = []


class ChooseStep(_Model):
    choose: list[Branch] = Field(min_length=1)


def _step_tag(value: Any) -> str | None:
    if isinstance(value, dict):
        kinds = [k for k in STEP_KINDS if k in value]
        return _STEP_TAG_PREFIX + kinds[0] if len(kinds) == 1 else None
    for kind, cls in zip(
        STEP_KINDS, (AgentStep, LoopStep, FanoutStep, ParallelStep, ChooseStep), strict=True
    ):
        if isinstance(value, cls):
            return _STEP_TAG_PREFIX + kind
    return None


Step = Annotated[
    Annotated[AgentStep, Tag("step:agent")]
    | Annotated[LoopStep, Tag("step:loop")]
    | Annotated[FanoutStep, Tag("step:fanout")]
    | Annotated[ParallelStep, Tag("step:parallel")]
    | Annotated[ChooseStep, Tag("step:choose")],
    Discriminator(
        _step_tag,
        custom_error_type="invalid_step",
        custom_error_message=f"a step needs exactly one of: {', '.join(STEP_KINDS)}",
    ),
]

for _cls in (LoopStep, FanoutStep, ParallelStep, Branch, ChooseStep):
    _cls.model_rebuild()


class InputClassSpec(_Model):
    """A class of inputs (a topic, a difficulty level) and its difficulty: Beta-distributed with
    this mean and concentration (a + b)."""

    name: _Name
    share: float = Field(gt=0)  # relative frequency among the classes
    difficulty: float = Field(gt=0, lt=1)  # mean difficulty
    concentration: float = Field(default=6.0, gt=0)


class AccuracySpec(_Model):
    """Per-input accuracy labels of a workflow whose agents have model alternatives (Aragog);
    clairvoyant.workloads.accuracy says how they are drawn."""

    reference_accuracy: float = Field(gt=0, lt=1)  # every agent on its most expensive model
    base_accuracy: float = Field(gt=0, lt=1)  # every agent on its cheapest model
    weights: dict[str, float] = {}  # agent -> weight (> 0); unnamed: heavier downstream (accuracy.py)
    classes: list[InputClassSpec] = Field(min_length=1)
    hidden_difficulty: float = Field(default=0.1, ge=0)  # sd of the difficulty the text does not show
    answer_noise: float = Field(default=0.02, ge=0)  # sd of each configuration's per-input luck
    perturbation: float = Field(default=0.005, ge=0)  # sd of each configuration's accuracy offset
    # A configuration is accurate on an input when its chance of a right answer is within this of c*'s.
    tolerance: float = Field(default=0.02, ge=0, lt=1)

    @model_validator(mode="after")
    def _consistent(self) -> AccuracySpec:
        if self.base_accuracy > self.reference_accuracy:
            raise ValueError("base_accuracy must be <= reference_accuracy")
        if any(w <= 0 for w in self.weights.values()):
            raise ValueError("weights must be > 0")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError("class names must be unique")
        return self


class WorkflowSpec(_Model):
    version: Literal[1] = 1
    name: _Name
    description: str = ""
    models: dict[str, str] = Field(min_length=1)  # alias -> served model name
    agents: dict[_Name, AgentSpec] = Field(min_length=1)
    flow: list[Step] = Field(min_length=1)
    accuracy: AccuracySpec | None = None  # per-input accuracy labels (Aragog workloads)


# ---------------------------------------------------------------------------------------------------
# Loading and error reporting


def load_spec(source: str | Path | Mapping[str, Any]) -> WorkflowSpec:
    """Parse and validate a spec from a YAML/JSON file path or an already-parsed mapping."""
    label: str | None = None
    if isinstance(source, str | Path):
        path = Path(source)
        label = str(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise SpecError([("", f"cannot read {path}: {exc.strerror or exc}")], label) from None
        try:
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (yaml.YAMLError, json.JSONDecodeError) as exc:
            raise SpecError(
                [("", f"not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}")], label
            ) from None
    else:
        data = source
    if not isinstance(data, Mapping):
        raise SpecError([("", "the spec must be a mapping with name, models, agents and flow")], label)
    try:
        spec = WorkflowSpec.model_validate(dict(data))
    except ValidationError as exc:
        raise SpecError([_describe(err) for err in exc.errors()], label) from None
    problems = list(_check_references(spec))
    if problems:
        raise SpecError(problems, label)
    return spec


def format_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part != "[key]" and not part.startswith((_STEP_TAG_PREFIX, DIST_TAG_PREFIX)):  # not paths
            out += f".{part}" if out else part
    return out


def _describe(err: Any) -> tuple[str, str]:
    loc = tuple(err["loc"])
    ctx = err.get("ctx") or {}
    kind = err["type"]
    if kind == "union_tag_invalid" and str(ctx.get("tag", "")).startswith(DIST_TAG_PREFIX):
        tag = str(ctx["tag"])[len(DIST_TAG_PREFIX) :]
        if tag == "?":
            return format_path(loc), "must be a number or a mapping (mean and cv, or dist and its parameters)"
        choices = ", ".join(
            t.strip("'")[len(DIST_TAG_PREFIX) :] for t in str(ctx["expected_tags"]).split(", ")
        )
        return format_path(loc + ("dist",)), f"unknown distribution {tag!r}; choose one of: {choices}"
    messages = {
        "greater_than_equal": lambda: f"must be >= {_number(ctx['ge'])}",
        "greater_than": lambda: f"must be > {_number(ctx['gt'])}",
        "less_than_equal": lambda: f"must be <= {_number(ctx['le'])}",
        "less_than": lambda: f"must be < {_number(ctx['lt'])}",
        "missing": lambda: "is required",
        "extra_forbidden": lambda: "unknown field",
        "literal_error": lambda: (
            "must be " + str(ctx["expected"]).replace("False", "false").replace("True", "true")
        ),
        "too_short": lambda: f"must have at least {ctx['min_length']} item(s)",
        "string_pattern_mismatch": lambda: "must be a name of letters, digits, '_', '-' or '.'",
        "value_error": lambda: str(err["msg"]).removeprefix("Value error, "),
    }
    make = messages.get(kind)
    return format_path(loc), make() if make else str(err["msg"])


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, int | float) else str(value)


def _unknown(kind: str, name: str, known: Iterable[str]) -> str:
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown {kind} {name!r}{hint}; {kind}s are: {', '.join(known)}"


def _walk(steps: list[Any], path: str) -> Iterator[tuple[str, Any]]:
    for i, step in enumerate(steps):
        here = f"{path}[{i}]"
        yield here, step
        if isinstance(step, LoopStep):
            yield from _walk(step.loop, f"{here}.loop")
        elif isinstance(step, FanoutStep):
            yield from _walk(step.fanout, f"{here}.fanout")
        elif isinstance(step, ParallelStep):
            for j, branch in enumerate(step.parallel):
                yield from _walk(branch, f"{here}.parallel[{j}]")
        elif isinstance(step, ChooseStep):
            for j, choice in enumerate(step.choose):
                yield from _walk(choice.do, f"{here}.choose[{j}].do")


def _check_references(spec: WorkflowSpec) -> Iterator[tuple[str, str]]:
    for name, agent in spec.agents.items():
        if agent.model not in spec.models:
            yield f"agents.{name}.model", _unknown("model", agent.model, spec.models)
        for i, alt in enumerate(agent.alternatives):
            if alt not in spec.models:
                yield f"agents.{name}.alternatives[{i}]", _unknown("model", alt, spec.models)
        for i, ref in enumerate(agent.prompt.inputs):
            for other in ref.agents:
                if other not in spec.agents:
                    yield f"agents.{name}.prompt.inputs[{i}].agent", _unknown("agent", other, spec.agents)
    if spec.accuracy is not None:
        if not any(a.alternatives for a in spec.agents.values()):
            yield "accuracy", "accuracy labels need an agent with alternatives"
        for weighted in spec.accuracy.weights:
            if weighted not in spec.agents:
                yield f"accuracy.weights.{weighted}", _unknown("agent", weighted, spec.agents)
    used: set[str] = set()
    for path, step in _walk(spec.flow, "flow"):
        if isinstance(step, AgentStep):
            used.add(step.agent)
            if step.agent not in spec.agents:
                yield f"{path}.agent", _unknown("agent", step.agent, spec.agents)
        elif isinstance(step, LoopStep | FanoutStep):
            what = "a loop" if isinstance(step, LoopStep) else "a fan-out"
            low, high = step.count.support()
            if high == math.inf:
                yield f"{path}.count.max", f"{what} count needs a finite bound"
            if isinstance(step, FanoutStep) and low < 1:
                yield f"{path}.count", f"{what} count must be >= 1 (set min)"
        elif isinstance(step, ChooseStep):
            total = sum(b.p for b in step.choose)
            if abs(total - 1) > 1e-6:
                yield f"{path}.choose", f"probabilities sum to {total:g}, must sum to 1"
    for name in spec.agents:
        if name not in used:
            yield f"agents.{name}", "defined but never used in flow"
    most = max_calls(spec.flow)
    if MAX_CALLS_PER_WORKFLOW < most < math.inf:  # an infinite bound is reported at its count
        yield "flow", f"up to {most:g} calls per workflow; the limit is {MAX_CALLS_PER_WORKFLOW}"


def count_bound(count: Any) -> float:
    """The largest integer a count distribution can produce (stochastic rounding included)."""
    high = count.support()[1]
    return high if high == math.inf else float(math.ceil(high))


def max_calls(steps: list[Any]) -> float:
    total = 0.0
    for step in steps:
        if isinstance(step, AgentStep):
            total += 1
        elif isinstance(step, LoopStep):
            total += count_bound(step.count) * max_calls(step.loop)
        elif isinstance(step, FanoutStep):
            total += count_bound(step.count) * max_calls(step.fanout)
        elif isinstance(step, ParallelStep):
            total += sum(max_calls(branch) for branch in step.parallel)
        elif isinstance(step, ChooseStep):
            total += max((max_calls(b.do) for b in step.choose), default=0.0)
    return total


def expected_calls(steps: list[Any]) -> dict[str, float]:
    """Expected number of calls of each agent (counts and branches are drawn independently)."""
    out: dict[str, float] = {}

    def add(part: dict[str, float], weight: float) -> None:
        for agent, n in part.items():
            out[agent] = out.get(agent, 0.0) + weight * n

    for step in steps:
        if isinstance(step, AgentStep):
            add({step.agent: 1.0}, 1.0)
        elif isinstance(step, LoopStep):
            add(expected_calls(step.loop), step.count.moments()[0])
        elif isinstance(step, FanoutStep):
            add(expected_calls(step.fanout), step.count.moments()[0])
        elif isinstance(step, ParallelStep):
            for branch in step.parallel:
                add(expected_calls(branch), 1.0)
        elif isinstance(step, ChooseStep):
            for b in step.choose:
                add(expected_calls(b.do), b.p)
    return out
