"""Prompt-composition templates: which earlier blocks each agent's prompt is made of.

Records carry chained 16-token block hashes (``clairvoyant.core.blockhash``) of the prompt and the
response; the only relation chained hashes reveal is a shared *prefix*, so a template is one prefix
source (an earlier call of the instance, or the agent's static prefix) and the new rest, e.g.
``${engineer[-1]:prompt:[0,$]}${engineer[-1]:response:[0,$]}${new}``.

* ``ChainStore`` keeps an open instance's chains deduplicated, cut at ``max_chain_blocks`` per call
  and ``max_instance_blocks`` per instance; hashes only, never text.
* ``describe`` writes one call's template; ``static_run`` finds an agent's static prefix.
* ``TemplateLearner`` learns each agent's dominant template from closed instances and serves it
  (``template(agent)``, "" for an agent it has none for).

The notation, how a source is chosen and how the dominant template is spelled: docs/profiler.md,
"Prompt-composition templates".
"""

from __future__ import annotations

import math
from array import array
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from clairvoyant.core.blockhash import common_prefix

NEW = "${new}"
_RANK = {"$": 0, "abs": 1, "rel": 2, "*": 3}


@dataclass(frozen=True, slots=True)
class TemplateConfig:
    max_chain_blocks: int = 8192  # per call: blocks of prompt + response kept while the instance is open
    max_instance_blocks: int = 1 << 18  # distinct blocks kept per open instance
    max_sources: int = 64  # earlier calls a prompt is compared with
    static_window: int = 32  # first prompts per agent (one per instance) kept to find the static prefix
    max_static_blocks: int = 2048
    static_min_share: float = 0.5
    spelling_min_share: float = 0.9
    max_spellings: int = 256  # distinct (shape, spelling) counters kept per agent


class ChainCall(NamedTuple):
    """One call's chain, materialised: ``chain[:prompt_len]`` is the prompt, the rest the response."""

    request_id: str
    agent_id: str
    start: float
    prompt_len: int
    chain: Sequence[int]


@dataclass
class _Node:
    request_id: str
    agent_id: str
    start: float
    prompt_len: int
    parent: int  # the node whose chain this one continues (-1: none)
    shared: int  # blocks taken from the parent's chain
    suffix: array  # the blocks this call added (array('Q'))


class ChainStore:
    """The prompt+response chains of one open workflow instance, deduplicated (hashes only).

    ``first`` maps every block hash held to the node that introduced it; since chains are prefix
    closed, a chain's longest prefix held here is found by a binary search on membership."""

    def __init__(self, config: TemplateConfig) -> None:
        self.config = config
        self.nodes: list[_Node] = []
        self.first: dict[int, int] = {}

    @property
    def blocks(self) -> int:
        return len(self.first)

    def held_prefix(self, chain: Sequence[int]) -> int:
        """The largest k with ``chain[k - 1]`` held (so ``chain[:k]`` is a prefix of a stored chain)."""
        lo, hi = 0, len(chain)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if chain[mid - 1] in self.first:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def add(
        self, request_id: str, agent_id: str, start: float, prompt: Sequence[int], response: Sequence[int]
    ) -> bool:
        """Store one call's chain; False (nothing stored) once the instance's block budget is spent."""
        limit = self.config.max_chain_blocks
        chain = list(prompt[:limit]) + list(response[: max(limit - len(prompt), 0)])
        shared = self.held_prefix(chain)
        if self.blocks + len(chain) - shared > self.config.max_instance_blocks:
            return False
        parent = self.first[chain[shared - 1]] if shared else -1
        index = len(self.nodes)
        suffix = array("Q", chain[shared:])
        self.nodes.append(_Node(request_id, agent_id, start, min(len(prompt), limit), parent, shared, suffix))
        for h in suffix:
            self.first.setdefault(h, index)
        return True

    def calls(self) -> list[ChainCall]:
        """Every stored call with its whole chain, in (start, request id) order."""
        chains: list[list[int]] = []
        for node in self.nodes:  # a parent is always stored before its children
            head = chains[node.parent][: node.shared] if node.parent >= 0 else []
            chains.append(head + node.suffix.tolist())
        out = [
            ChainCall(n.request_id, n.agent_id, n.start, n.prompt_len, c)
            for n, c in zip(self.nodes, chains, strict=True)
        ]
        return sorted(out, key=lambda c: (c.start, c.request_id))

    def to_state(self) -> list[dict[str, Any]]:
        return [
            {
                "request_id": n.request_id,
                "agent_id": n.agent_id,
                "start": n.start,
                "prompt_len": n.prompt_len,
                "parent": n.parent,
                "shared": n.shared,
                "suffix": n.suffix.tolist(),
            }
            for n in self.nodes
        ]

    @classmethod
    def from_state(cls, state: list[dict[str, Any]], config: TemplateConfig) -> ChainStore:
        store = cls(config)
        for i, n in enumerate(state):
            suffix = array("Q", (int(h) for h in n["suffix"]))
            store.nodes.append(
                _Node(
                    n["request_id"],
                    n["agent_id"],
                    float(n["start"]),
                    int(n["prompt_len"]),
                    int(n["parent"]),
                    int(n["shared"]),
                    suffix,
                )
            )
            for h in suffix:
                store.first.setdefault(h, i)
        return store


# ------------------------------------------------------------------------------ descriptions


class Description(NamedTuple):
    """One prompt's template: its shape and the spellings of its varying end, preferred first."""

    shape: str
    spellings: tuple[tuple[int, str], ...]  # (preference rank, template text)


def _ends(matched: int, length: int) -> list[tuple[int, str]]:
    """The spellings of a range end: ``matched`` of the source's ``length`` blocks were used."""
    ends = [(_RANK["abs"], str(matched))]
    if matched >= length:
        ends.insert(0, (_RANK["$"], "$"))
    else:
        ends.append((_RANK["rel"], f"$-{length - matched}"))
    return ends


def describe(
    calls: Sequence[ChainCall], static_runs: dict[str, Sequence[int]], max_sources: int = 64
) -> list[tuple[str, Description]]:
    """(agent, description) for every call, ``calls`` in start order (``ChainStore.calls()``)."""
    out: list[tuple[str, Description]] = []
    for i, call in enumerate(calls):
        prompt = call.chain[: call.prompt_len]
        best, source = 0, -1
        for j in range(i - 1, max(i - max_sources, 0) - 1, -1):  # most recent first: ties keep it
            shared = common_prefix(prompt, calls[j].chain)
            if shared > best:
                best, source = shared, j
        static = static_runs.get(call.agent_id, ())
        static_shared = common_prefix(prompt, static)
        if static_shared and static_shared >= best:
            head = "${static:[0,"
            ends = _ends(static_shared, len(static))
            tail = "]}" + NEW
        elif source >= 0:
            src = calls[source]
            back = sum(1 for c in calls[source:i] if c.agent_id == src.agent_id)
            name = f"{src.agent_id}[-{back}]"
            if best <= src.prompt_len:
                head, ends = "${" + name + ":prompt:[0,", _ends(best, src.prompt_len)
            else:
                head = "${" + name + ":prompt:[0,$]}${" + name + ":response:[0,"
                ends = _ends(best - src.prompt_len, len(src.chain) - src.prompt_len)
            tail = "]}" + NEW
        else:
            out.append((call.agent_id, Description(NEW, ((0, NEW),))))
            continue
        shape = head + "*" + tail
        out.append((call.agent_id, Description(shape, tuple((r, head + e + tail) for r, e in ends))))
    return out


def static_run(samples: Iterable[Sequence[int]], min_share: float) -> tuple[int, ...]:
    """The longest block run at least ``min_share`` (and at least two) of ``samples`` start with."""
    chains = [s for s in samples if s]
    need = max(2, math.ceil(min_share * len(chains)))
    if len(chains) < need:
        return ()

    def dominant(depth: int) -> tuple[int, int]:
        counts = Counter(c[depth - 1] for c in chains if len(c) >= depth)
        return counts.most_common(1)[0] if counts else (0, 0)

    lo, hi = 0, max(len(c) for c in chains)
    while lo < hi:  # the count of the commonest hash at a depth never grows with the depth
        mid = (lo + hi + 1) // 2
        if dominant(mid)[1] >= need:
            lo = mid
        else:
            hi = mid - 1
    if lo == 0:
        return ()
    last = dominant(lo)[0]
    holder = next(c for c in chains if len(c) >= lo and c[lo - 1] == last)
    return tuple(holder[:lo])


# ------------------------------------------------------------------------------------ learning


@dataclass(frozen=True, slots=True)
class AgentTemplate:
    agent_id: str
    template: str  # the dominant template (module doc's notation)
    support: int  # calls whose prompt fits it
    calls: int  # calls of this agent described
    static_blocks: int  # length of the agent's static prefix


@dataclass
class _AgentCounts:
    calls: int = 0
    shapes: Counter[str] = field(default_factory=Counter)
    spellings: Counter[tuple[str, int, str]] = field(default_factory=Counter)  # (shape, rank, text)


class TemplateLearner:
    """Per agent: the static prefix and the dominant template, from closed instances' chains."""

    def __init__(self, config: TemplateConfig | None = None) -> None:
        self.config = config or TemplateConfig()
        self.samples: dict[str, deque[tuple[int, ...]]] = {}
        self.static: dict[str, tuple[int, ...]] = {}
        self.counts: dict[str, _AgentCounts] = {}
        self._cache: dict[str, AgentTemplate] | None = None
        self._seen = 0  # instances learned

    def learn(self, calls: Sequence[ChainCall]) -> None:
        """One closed instance: ``calls`` in start order, as ``ChainStore.calls()`` returns them."""
        if not calls:
            return
        self._seen += 1
        firsts: dict[str, tuple[int, ...]] = {}
        for c in calls:
            if c.agent_id not in firsts:
                firsts[c.agent_id] = tuple(c.chain[: min(c.prompt_len, self.config.max_static_blocks)])
        for agent, prompt in firsts.items():
            window = self.samples.setdefault(agent, deque(maxlen=self.config.static_window))
            window.append(prompt)
            current = self.static.get(agent, ())
            # Recomputing costs a pass over the window: do it while the window fills, when this
            # prompt breaks the current run, and every eighth instance after that.
            if (
                len(window) < self.config.static_window
                or prompt[: len(current)] != current
                or len(current) == 0
                or self._seen % 8 == 0
            ):
                self.static[agent] = static_run(window, self.config.static_min_share)
        for agent, desc in describe(calls, dict(self.static), self.config.max_sources):
            counts = self.counts.setdefault(agent, _AgentCounts())
            counts.calls += 1
            counts.shapes[desc.shape] += 1
            for rank, text in desc.spellings:
                counts.spellings[(desc.shape, rank, text)] += 1
            if len(counts.spellings) > self.config.max_spellings:
                counts.spellings = Counter(dict(counts.spellings.most_common(self.config.max_spellings // 2)))
        self._cache = None

    def templates(self) -> dict[str, AgentTemplate]:
        if self._cache is None:
            self._cache = {a: self._dominant(a, c) for a, c in sorted(self.counts.items())}
        return self._cache

    def template(self, agent_id: str) -> str:
        found = self.templates().get(agent_id)
        return found.template if found is not None else ""

    def _dominant(self, agent: str, counts: _AgentCounts) -> AgentTemplate:
        shape, shape_count = min(counts.shapes.items(), key=lambda sc: (-sc[1], sc[0]))
        fitting = [
            (rank, -n, text)
            for (s, rank, text), n in counts.spellings.items()
            if s == shape and n >= self.config.spelling_min_share * shape_count
        ]
        rank, neg_support, text = min(fitting) if fitting else (_RANK["*"], -shape_count, shape)
        return AgentTemplate(agent, text, -neg_support, counts.calls, len(self.static.get(agent, ())))

    def to_state(self) -> dict[str, Any]:
        return {
            "samples": {a: [list(s) for s in w] for a, w in self.samples.items()},
            "counts": {
                a: {
                    "calls": c.calls,
                    "shapes": dict(c.shapes),
                    "spellings": [[s, r, t, n] for (s, r, t), n in c.spellings.items()],
                }
                for a, c in self.counts.items()
            },
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], config: TemplateConfig) -> TemplateLearner:
        learner = cls(config)
        for agent, window in state["samples"].items():
            learner.samples[agent] = deque(
                (tuple(int(h) for h in s) for s in window), maxlen=config.static_window
            )
            learner.static[agent] = static_run(learner.samples[agent], config.static_min_share)
        for agent, c in state["counts"].items():
            learner.counts[agent] = _AgentCounts(
                int(c["calls"]),
                Counter({s: int(n) for s, n in c["shapes"].items()}),
                Counter({(s, int(r), t): int(n) for s, r, t, n in c["spellings"]}),
            )
        return learner
