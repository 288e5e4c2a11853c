"""A workflow program: the calls one workflow instance makes, as a static DAG a driver executes.

A ``Call`` is ready when every call in ``dependencies`` has completed *and* that call's tool (the
``tool_latency_s`` after it) has finished.  Fan-out = several calls depending on the same parent;
join = one call depending on several.  ``calls`` is in a topological order: dependencies and every
call a prompt segment points at come earlier in the tuple.

A prompt is a list of segments, so prefix reuse is explicit for the cache::

    ("system", agent_id, n)              the first n tokens of the agent's system prompt; the text is
                                         fixed per (workflow type, agent), so two system segments of
                                         one agent share min(n1, n2) tokens across workflows
    ("call", call_id, "prompt"|"response", n)
                                         the first n tokens of an earlier call's prompt or response
                                         in the same workflow (that call is always an ancestor)
    ("new", n)                           n fresh tokens: user input, tool output, retrieved text

``prompt_tokens`` is the sum of the segments' tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, NamedTuple, cast

from clairvoyant.workloads.errors import ProgramError

if TYPE_CHECKING:
    from clairvoyant.workloads.accuracy import WorkflowInput

Part = Literal["prompt", "response"]


class SystemSegment(NamedTuple):
    kind: Literal["system"]
    agent_id: str
    tokens: int


class CallSegment(NamedTuple):
    kind: Literal["call"]
    call_id: str
    part: Part
    tokens: int


class NewSegment(NamedTuple):
    kind: Literal["new"]
    tokens: int


Segment = SystemSegment | CallSegment | NewSegment


@dataclass(frozen=True, slots=True)
class Call:
    call_id: str  # "<workflow_id>/<index>": unique across workflows
    index: int  # position in WorkflowProgram.calls
    agent_id: str
    model: str  # served model name
    prompt: tuple[Segment, ...]  # composition, in prompt order
    prompt_tokens: int  # sum of the segments' tokens
    output_tokens: int  # tokens to generate (the driver sets max_tokens and ignores EOS)
    dependencies: tuple[str, ...]  # call ids that must complete (tool included) before this starts
    tool: str | None = None  # tool (or human) interrupt after this call; None: no tool
    tool_latency_s: float = 0.0  # how long it takes; dependents wait for it
    alternative_models: tuple[str, ...] = ()  # other served models that may run this agent (Aragog)


@dataclass(frozen=True)
class WorkflowProgram:
    workflow_type: str  # the app_metadata workflow_type_id (the workload name)
    workflow_id: str
    calls: tuple[Call, ...]
    input: WorkflowInput | None = None  # the input's text and accuracy labels (Aragog workloads)
    _by_id: dict[str, Call] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {c.call_id: c for c in self.calls})

    def call(self, call_id: str) -> Call:
        return self._by_id[call_id]

    def __len__(self) -> int:
        return len(self.calls)

    def roots(self) -> tuple[Call, ...]:
        return tuple(c for c in self.calls if not c.dependencies)

    def dependents(self) -> dict[str, tuple[str, ...]]:
        """call id -> the calls that depend on it directly."""
        children: dict[str, list[str]] = {c.call_id: [] for c in self.calls}
        for c in self.calls:
            for dep in c.dependencies:
                children[dep].append(c.call_id)
        return {k: tuple(v) for k, v in children.items()}

    @property
    def total_prompt_tokens(self) -> int:
        return sum(c.prompt_tokens for c in self.calls)

    @property
    def total_output_tokens(self) -> int:
        return sum(c.output_tokens for c in self.calls)

    def check_integrity(self) -> None:
        """Raise ``ProgramError`` unless: ids are unique and indices positional; dependencies point
        to earlier calls (so the graph is acyclic); every call segment points at an ancestor and
        takes no more tokens than that prompt/response has; token counts add up and are positive."""
        ancestors: list[set[int]] = []
        for position, c in enumerate(self.calls):
            if c.index != position:
                raise ProgramError(f"{c.call_id}: index {c.index} at position {position}")
            mine: set[int] = set()
            for dep in c.dependencies:
                parent = self._by_id.get(dep)
                if parent is None or parent.index >= position:
                    raise ProgramError(f"{c.call_id}: dependency {dep} is not an earlier call")
                mine.add(parent.index)
                mine |= ancestors[parent.index]
            ancestors.append(mine)
            for seg in c.prompt:
                if seg.tokens <= 0:
                    raise ProgramError(f"{c.call_id}: empty segment {seg}")
                if seg.kind == "call":
                    ref = self._by_id.get(seg.call_id)
                    if ref is None or ref.index not in mine:
                        raise ProgramError(f"{c.call_id}: segment {seg} does not reference an ancestor")
                    limit = ref.prompt_tokens if seg.part == "prompt" else ref.output_tokens
                    if seg.tokens > limit:
                        raise ProgramError(f"{c.call_id}: segment {seg} exceeds {limit} tokens")
            if c.prompt_tokens != sum(seg.tokens for seg in c.prompt) or c.prompt_tokens <= 0:
                raise ProgramError(f"{c.call_id}: prompt_tokens {c.prompt_tokens} != sum of segments")
            if c.output_tokens <= 0 or c.tool_latency_s < 0 or (c.tool is None and c.tool_latency_s):
                raise ProgramError(f"{c.call_id}: bad output_tokens / tool latency")
        if len(self._by_id) != len(self.calls):
            raise ProgramError(f"{self.workflow_id}: duplicate call ids")


# Builders produce templates that point at earlier calls by index; ``materialize`` names them.
TemplateSegment = tuple[str, str, int] | tuple[str, int, Part, int] | tuple[str, int]


class CallTemplate(NamedTuple):
    agent_id: str
    model: str  # model alias, resolved to a served name by materialize()
    prompt: tuple[TemplateSegment, ...]  # ("system", agent, n) | ("call", index, part, n) | ("new", n)
    output_tokens: int
    dependencies: tuple[int, ...]
    tool: str | None = None
    tool_latency_s: float = 0.0
    alternatives: tuple[str, ...] = ()

    @property
    def prompt_tokens(self) -> int:
        return sum(int(seg[-1]) for seg in self.prompt)


def materialize(
    workflow_type: str,
    workflow_id: str,
    templates: Iterable[CallTemplate],
    served: Mapping[str, str],
    max_tool_latency_s: float | None = None,
) -> WorkflowProgram:
    """Name the calls ``<workflow_id>/<index>`` and resolve model aliases through ``served``."""
    calls: list[Call] = []
    ids: list[str] = []
    for index, t in enumerate(templates):
        call_id = f"{workflow_id}/{index}"
        ids.append(call_id)
        prompt: list[Segment] = []
        for seg in t.prompt:
            if seg[0] == "system":
                _, agent, tokens = cast(tuple[str, str, int], seg)
                prompt.append(SystemSegment("system", agent, tokens))
            elif seg[0] == "call":
                _, ref, part, tokens = cast(tuple[str, int, Part, int], seg)
                prompt.append(CallSegment("call", ids[ref], part, tokens))
            else:
                prompt.append(NewSegment("new", int(seg[1])))
        latency = (
            t.tool_latency_s if max_tool_latency_s is None else min(t.tool_latency_s, max_tool_latency_s)
        )
        calls.append(
            Call(
                call_id=call_id,
                index=index,
                agent_id=t.agent_id,
                model=served.get(t.model, t.model),
                prompt=tuple(prompt),
                prompt_tokens=sum(seg.tokens for seg in prompt),
                output_tokens=t.output_tokens,
                dependencies=tuple(ids[d] for d in t.dependencies),
                tool=t.tool,
                tool_latency_s=latency if t.tool is not None else 0.0,
                alternative_models=tuple(served.get(m, m) for m in t.alternatives),
            )
        )
    return WorkflowProgram(workflow_type=workflow_type, workflow_id=workflow_id, calls=tuple(calls))
