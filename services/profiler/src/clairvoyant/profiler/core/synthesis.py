"""Synthesis of a bounded path expression from traces (Pythia, seed 000, §4.1).

``synthesize(traces)`` returns a ``SynthesisResult``: the expression, its fitted choice
probabilities, the share of *all* the traces it accepts, and whether it is structured or the
generic bounded alternation loop over every step kind (the fallback when no structured expression
accepts ``min_acceptance`` of them), with what it cost in operations.  Raises ``ValueError`` when
given no trace.  Identical traces are handled once, and derivations are kept across calls in a
``path_fitting.DerivationCache`` (a pure memo), so a call costs the distinct traces it has not
derived before under the same expression.  The algorithm (dominant traces, tokens, loops,
sequence/alternatives/optionals, dominant-percentile bounds, check and fallback):
docs/profiler.md, "Synthesis"; its cost: "Learning cost".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import groupby
from operator import attrgetter

from clairvoyant.profiler.core.automaton import DEFAULT_PRUNE_THRESHOLD, TransitionAutomaton, step_label
from clairvoyant.profiler.core.expr import Agent, Alt, End, Expr, FanOut, Opt, Repeat, alt, seq
from clairvoyant.profiler.core.path_automaton import MAX_STATES, Weights
from clairvoyant.profiler.core.path_fitting import (
    DEFAULT_CACHE,
    DerivationCache,
    FitWork,
    Shape,
    fit,
    shapes_of,
)
from clairvoyant.profiler.core.trace import Step


@dataclass(frozen=True, slots=True)
class SynthesisConfig:
    prune_threshold: float = DEFAULT_PRUNE_THRESHOLD
    bound_tail: float = 0.01
    max_alternatives: int = 4
    min_acceptance: float = 0.9
    fallback_acceptance: float = 0.95
    # A structured expression must also accept min_acceptance of the workflows that close after
    # it was synthesised (prequential), over the last generalization_window of them once there
    # are generalization_min; otherwise the generic loop is served (WorkflowProfile).
    generalization_window: int = 32
    generalization_min: int = 16


@dataclass(frozen=True, slots=True)
class SynthesisResult:
    expr: Expr
    weights: Weights
    acceptance: float  # share of the input traces the expression accepts
    structured: bool  # False: the generic fallback loop
    dominant_traces: int  # traces that used no pruned transition
    work: FitWork = field(default_factory=FitWork)  # acceptance checks and fitting, in operations
    # the structured expression passed over because it does not generalise (``generalizes=False``)
    candidate: Expr | None = None


def dominant_bounds(values: Sequence[int], tail: float) -> tuple[int, int]:
    """(lo, hi): drop the smallest and the largest values while they hold < ``tail`` of the mass.

    With fewer than ``1 / tail`` samples nothing can be dropped and the sample extremes stand in
    for the p(tail) and p(1 - tail) percentiles.  When an extreme was seen only once the tail is
    still thinning out there and the extreme underestimates the percentile (a new sample falls
    outside the range of n distinct-valued samples with probability 2 / (n + 1): about 5% at
    n = 41, against the 2 * ``tail`` the bounds are meant to leave out; Good-Turing puts the mass
    of values not seen yet at singletons / n).  Such a singleton extreme is widened by one mean
    spacing of the order statistics, ceil((max - min) / (n - 1)) (never below 0): the expected
    distance to the next order statistic.  An extreme seen several times (``{2,4}`` from 60
    retries spread over 2, 3 and 4) looks like a hard limit and is kept.  With ``1 / tail``
    samples or more the percentiles are read off directly and nothing is widened.
    """
    counts = sorted(Counter(values).items())
    total = len(values)
    below = 0
    lo_index = 0
    for i, (_, n) in enumerate(counts):
        if (below + n) / total < tail and i < len(counts) - 1:
            below += n
            lo_index = i + 1
        else:
            break
    above = 0
    hi_index = len(counts) - 1
    for i in range(len(counts) - 1, lo_index, -1):
        n = counts[i][1]
        if (above + n) / total < tail:
            above += n
            hi_index = i - 1
        else:
            break
    lo, hi = counts[lo_index][0], counts[hi_index][0]
    if tail > 0 and total * tail < 1 and hi > lo:
        spacing = -(-(hi - lo) // (total - 1))
        if counts[lo_index][1] == 1:
            lo = max(lo - spacing, 0)
        if counts[hi_index][1] == 1:
            hi += spacing
    return lo, hi


@dataclass(frozen=True, slots=True)
class _Tok:
    sym: str
    run: int = 1
    widths: tuple[int, ...] = ()  # fan-out tokens: the width of each step of the run
    members: tuple[str, ...] = ()  # fan-out tokens: distinct member agent ids


@dataclass
class _Synth:
    config: SynthesisConfig
    loops: dict[str, Expr] = field(default_factory=dict)

    # ------------------------------------------------------------------------ tokens

    def bounds(self, values: Sequence[int]) -> tuple[int, int]:
        return dominant_bounds(values, self.config.bound_tail)

    def token_expr(self, occurrences: Sequence[_Tok]) -> Expr:
        sym = occurrences[0].sym
        if sym in self.loops:
            return self.loops[sym]
        if sym.startswith("<"):
            members = sorted({m for t in occurrences for m in t.members})
            wlo, whi = self.bounds([w for t in occurrences for w in t.widths])
            body: Agent | Alt = (
                Agent(members[0]) if len(members) == 1 else Alt(tuple(Agent(m) for m in members))
            )
            inner: Expr = FanOut(body, max(wlo, 1), max(whi, 1))
        else:
            inner = Agent(sym)
        lo, hi = self.bounds([t.run for t in occurrences])
        return inner if hi <= 1 else Repeat(inner, max(lo, 1), hi)

    @staticmethod
    def compress(sequence: Sequence[_Tok]) -> list[_Tok]:
        """Runs of one symbol merged into one token (loop tokens ``#k`` are never merged)."""
        out: list[_Tok] = []
        for sym, group in groupby(sequence, key=attrgetter("sym")):
            run = list(group)
            if len(run) == 1 or sym.startswith("#"):
                out.extend(run)
            else:
                out.append(
                    _Tok(
                        sym,
                        sum(t.run for t in run),
                        tuple(w for t in run for w in t.widths),
                        tuple(sorted({m for t in run for m in t.members})),
                    )
                )
        return out

    # ------------------------------------------------------------------------- driver

    def synth(self, sequences: Sequence[Sequence[_Tok]]) -> Expr | None:
        compressed: dict[int, list[_Tok]] = {}  # identical traces share one token list
        seqs = []
        for s in sequences:
            if id(s) not in compressed:
                compressed[id(s)] = self.compress(s)
            seqs.append(compressed[id(s)])
        seqs = self.drop_outliers(seqs)
        for scc in self.sccs(seqs):
            seqs = self.collapse(seqs, scc)
        return self.synth_dag(seqs)

    def drop_outliers(self, seqs: list[list[_Tok]]) -> list[list[_Tok]]:
        support: Counter[tuple[str, str]] = Counter()
        visits: Counter[str] = Counter()
        for s in seqs:
            syms = ["^", *(t.sym for t in s), "$"]
            visits.update(set(syms[:-1]))
            support.update(set(zip(syms, syms[1:], strict=False)))
        kept = [
            s
            for s in seqs
            if all(
                support[(u, v)] / visits[u] >= self.config.prune_threshold
                for u, v in zip(["^", *(t.sym for t in s)], [*(t.sym for t in s), "$"], strict=False)
            )
        ]
        return kept or seqs

    @staticmethod
    def sccs(seqs: list[list[_Tok]]) -> list[frozenset[str]]:
        graph: dict[str, set[str]] = {}
        for s in seqs:
            for a, b in zip(s, s[1:], strict=False):
                graph.setdefault(a.sym, set()).add(b.sym)
                graph.setdefault(b.sym, set())
            for t in s:
                graph.setdefault(t.sym, set())
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        found: list[frozenset[str]] = []
        counter = 0
        for root in sorted(graph):  # iterative Tarjan
            if root in index:
                continue
            work = [(root, iter(sorted(graph[root])))]
            index[root] = low[root] = counter
            counter += 1
            stack.append(root)
            on_stack.add(root)
            while work:
                node, children = work[-1]
                advanced = False
                for child in children:
                    if child not in index:
                        index[child] = low[child] = counter
                        counter += 1
                        stack.append(child)
                        on_stack.add(child)
                        work.append((child, iter(sorted(graph[child]))))
                        advanced = True
                        break
                    if child in on_stack:
                        low[node] = min(low[node], index[child])
                if advanced:
                    continue
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
        return found

    # -------------------------------------------------------------------------- loops

    def collapse(self, seqs: list[list[_Tok]], scc: frozenset[str]) -> list[list[_Tok]]:
        """Replace every maximal segment inside ``scc`` by one loop token."""
        segments: list[list[_Tok]] = []
        for s in seqs:
            i = 0
            while i < len(s):
                if s[i].sym in scc:
                    j = i
                    while j < len(s) and s[j].sym in scc:
                        j += 1
                    segments.append(s[i:j])
                    i = j
                else:
                    i += 1
        sym = f"#{len(self.loops)}"
        self.loops[sym] = self.loop_expr(segments)
        out: list[list[_Tok]] = []
        for s in seqs:
            new: list[_Tok] = []
            for tok in s:
                if tok.sym in scc:
                    if not new or new[-1].sym != sym:
                        new.append(_Tok(sym))
                else:
                    new.append(tok)
            out.append(new)
        return out

    def loop_expr(self, segments: list[list[_Tok]]) -> Expr:
        header = Counter(s[0].sym for s in segments).most_common(1)[0][0]
        exit_ = Counter(s[-1].sym for s in segments).most_common(1)[0][0]
        conforming = [s for s in segments if s[0].sym == header and s[-1].sym == exit_]
        blocks_per = [self.split(s, header) for s in conforming]
        full_ends = Counter(b[-1].sym for blocks in blocks_per for b in blocks[:-1])
        if len(conforming) < (1 - self.config.prune_threshold) * len(segments) or not full_ends:
            return self.generic_loop(segments)
        if full_ends.most_common(1)[0][0] == exit_:  # do-while: B^k
            return self.repeat([blocks for blocks in blocks_per], lo_floor=1) or self.generic_loop(segments)
        # rework: L (R L)^k -- cut every full block after its first ``exit_``
        firsts: list[list[_Tok]] = []
        iterations: list[list[list[_Tok]]] = []
        for blocks in blocks_per:
            parts = []
            for b in blocks[:-1]:
                cut = next((i for i, t in enumerate(b) if t.sym == exit_), None)
                if cut is None:
                    return self.generic_loop(segments)
                parts.append((b[: cut + 1], b[cut + 1 :]))
            lefts = [p[0] for p in parts] + [blocks[-1]]
            firsts.append(lefts[0])
            iterations.append([p[1] + lefts[i + 1] for i, p in enumerate(parts)])
        head = self.synth(firsts)
        return seq(head, self.repeat(iterations, lo_floor=0)) or self.generic_loop(segments)

    @staticmethod
    def split(segment: list[_Tok], header: str) -> list[list[_Tok]]:
        blocks: list[list[_Tok]] = [[]]
        for i, tok in enumerate(segment):
            if i > 0 and tok.sym == header:
                blocks.append([])
            blocks[-1].append(tok)
        return blocks

    def repeat(self, iterations: list[list[list[_Tok]]], lo_floor: int) -> Expr | None:
        """(B){m,n} over per-segment iteration lists; {0,1} -> (B)?, {1,2} -> B1 -> (B2)?."""
        lo, hi = self.bounds([len(its) for its in iterations])
        lo = max(lo, lo_floor)
        hi = max(hi, lo)
        if hi == 0:
            return None
        if (lo, hi) == (1, 2):
            first = self.synth([its[0] for its in iterations if its])
            second = self.synth([its[1] for its in iterations if len(its) > 1])
            return seq(first, Opt(second)) if second is not None else first
        body = self.synth([b for its in iterations for b in its])
        if body is None:
            return None
        if (lo, hi) == (1, 1):
            return body
        if (lo, hi) == (0, 1):
            return Opt(body)
        return Repeat(body, lo, hi)

    def generic_loop(self, segments: Sequence[Sequence[_Tok]]) -> Expr:
        by_sym: dict[str, list[_Tok]] = {}
        for s in segments:
            for t in s:
                by_sym.setdefault(t.sym, []).append(_Tok(t.sym, 1, t.widths, t.members))
        options = [self.token_expr(occ) for _, occ in sorted(by_sym.items())]
        lo, hi = self.bounds([sum(t.run for t in s) for s in segments])
        body = alt(*options)
        hi = min(max(hi, 1), _max_repeat(body))
        lo = min(max(lo, 1), hi)  # segments are never empty: {0,n} would admit an empty run
        return body if (lo, hi) == (1, 1) else Repeat(body, lo, hi)

    # ------------------------------------------------------------------- loop-free part

    def synth_dag(self, seqs: list[list[_Tok]]) -> Expr | None:
        nonempty = [s for s in seqs if s]
        if not nonempty:
            return None
        optional = len(nonempty) < len(seqs)
        body = self.synth_nonempty(nonempty)
        if not optional:
            return body
        return body if isinstance(body, Opt) else Opt(body)

    def synth_nonempty(self, seqs: list[list[_Tok]]) -> Expr:
        if any(len({t.sym for t in s}) < len(s) for s in seqs):
            return self.generic_loop(seqs)
        anchors = self.anchors(seqs)
        if anchors:
            parts: list[Expr | None] = []
            cuts = [[next(i for i, t in enumerate(s) if t.sym == a) for a in anchors] for s in seqs]
            for k in range(len(anchors) + 1):
                gaps = [
                    s[(c[k - 1] + 1 if k else 0) : (c[k] if k < len(anchors) else len(s))]
                    for s, c in zip(seqs, cuts, strict=True)
                ]
                parts.append(self.synth_dag(gaps))
                if k < len(anchors):
                    parts.append(self.token_expr([s[c[k]] for s, c in zip(seqs, cuts, strict=True)]))
            result = seq(*parts)
            assert result is not None
            return result
        groups = self.groups(seqs)
        if len(groups) > 1:
            return alt(*(self.synth_nonempty(g) for g in sorted(groups, key=len, reverse=True)))
        shapes: dict[tuple[str, ...], list[list[_Tok]]] = {}
        for s in seqs:
            shapes.setdefault(tuple(t.sym for t in s), []).append(s)
        if len(shapes) <= self.config.max_alternatives:
            options = []
            for members in sorted(shapes.values(), key=len, reverse=True):
                option = seq(*(self.token_expr([m[i] for m in members]) for i in range(len(members[0]))))
                assert option is not None
                options.append(option)
            return alt(*options)
        return self.linear(seqs) or self.generic_loop(seqs)

    def linear(self, seqs: list[list[_Tok]]) -> Expr | None:
        """Skip edges over one topological order: every sequence is a subsequence of the order;
        neighbours that never occur together become an alternative; items missing from some
        sequences are optional, and neighbouring optionals present in the same sequences share one
        ``(...)?``.  None when the symbols have no common order."""
        after: dict[str, set[str]] = {}
        where: dict[str, set[int]] = {}
        position: dict[str, list[int]] = {}
        for n, s in enumerate(seqs):
            for i, t in enumerate(s):
                after.setdefault(t.sym, set()).update(u.sym for u in s[i + 1 :])
                where.setdefault(t.sym, set()).add(n)
                position.setdefault(t.sym, []).append(i)
        order: list[str] = []
        pending = set(after)
        while pending:  # Kahn, ties by mean position
            ready = [x for x in pending if not any(x in after[y] for y in pending if y != x)]
            if not ready:
                return None
            nxt = min(ready, key=lambda x: (sum(position[x]) / len(position[x]), x))
            order.append(nxt)
            pending.discard(nxt)
        blocks: list[list[str]] = []
        for sym in order:
            if blocks and all(not (where[sym] & where[other]) for other in blocks[-1]):
                blocks[-1].append(sym)
            else:
                blocks.append([sym])
        items: list[tuple[frozenset[int], Expr]] = []
        for block in blocks:
            present = frozenset().union(*(where[x] for x in block))
            options = [self.token_expr([t for s in seqs for t in s if t.sym == x]) for x in block]
            items.append((present, alt(*options)))
        parts: list[Expr | None] = []
        everyone = frozenset(range(len(seqs)))
        i = 0
        while i < len(items):
            present, expr = items[i]
            j = i + 1
            while present != everyone and j < len(items) and items[j][0] == present:
                j += 1
            group = seq(*(e for _, e in items[i:j]))
            assert group is not None
            parts.append(group if present == everyone else Opt(group))
            i = j
        return seq(*parts)

    @staticmethod
    def anchors(seqs: list[list[_Tok]]) -> list[str]:
        common = set.intersection(*({t.sym for t in s} for s in seqs))
        order = [t.sym for t in seqs[0] if t.sym in common]
        positions = [{t.sym: i for i, t in enumerate(s)} for s in seqs]
        kept: list[str] = []
        for sym in order:
            if all(not kept or pos[sym] > pos[kept[-1]] for pos in positions):
                kept.append(sym)
        return kept

    @staticmethod
    def groups(seqs: list[list[_Tok]]) -> list[list[list[_Tok]]]:
        parent: dict[str, str] = {}

        def find(x: str) -> str:
            while parent.setdefault(x, x) != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for s in seqs:
            for t in s[1:]:
                parent[find(t.sym)] = find(s[0].sym)
            find(s[0].sym)
        out: dict[str, list[list[_Tok]]] = {}
        for s in seqs:
            out.setdefault(find(s[0].sym), []).append(s)
        return list(out.values())


def _max_repeat(body: Expr) -> int:
    """The largest repetition count that keeps the unrolled automaton well under MAX_STATES."""
    size = len(body.options) + 3 if isinstance(body, Alt) else 4
    return max(1, MAX_STATES // (2 * size))


@lru_cache(maxsize=4096)
def _token(step: Step) -> _Tok:
    if len(step.agents) == 1:
        return _Tok(step.agents[0])
    return _Tok(step_label(step), 1, (len(step.agents),), tuple(sorted(set(step.agents))))


def _acceptance(expr: Expr, shapes: Counter[Shape], cache: DerivationCache | None, work: FitWork) -> float:
    derivations = cache if cache is not None else DEFAULT_CACHE
    accepted = sum(n for shape, n in shapes.items() if derivations.derive(expr, shape, work) is not None)
    return accepted / sum(shapes.values()) if shapes else 0.0


def generic_expression(
    traces: Sequence[Sequence[Step]],
    config: SynthesisConfig = SynthesisConfig(),
    cache: DerivationCache | None = None,
    work: FitWork | None = None,
) -> Expr:
    """``(x | y | <z>{m,n} | ...){lo,hi} -> $`` over every step kind; accepts >= fallback_acceptance."""
    synth = _Synth(config)
    shapes = shapes_of(traces)
    tokens = [[_token(s) for s in t] for t in shapes if t]
    counts = [n for t, n in shapes.items() if t]
    segments = [tokens[i] for i, n in enumerate(counts) for _ in range(n)]
    for tail in (config.bound_tail, 0.0):
        synth.config = SynthesisConfig(config.prune_threshold, tail, config.max_alternatives)
        loop = synth.generic_loop(segments)
        expr = seq(Opt(loop) if any(not t for t in shapes) else loop, End())
        assert expr is not None
        if tail == 0.0 or _acceptance(expr, shapes, cache, work or FitWork()) >= config.fallback_acceptance:
            return expr
    raise AssertionError("unreachable")


def synthesize(
    traces: Sequence[Sequence[Step]],
    automaton: TransitionAutomaton | None = None,
    config: SynthesisConfig = SynthesisConfig(),
    cache: DerivationCache | None = None,
    generalizes: bool = True,
) -> SynthesisResult:
    """Synthesise the bounded path expression of a workflow type from its traces
    (docs/profiler.md, "Synthesis").  ``cache`` keeps derivations across calls (default: the
    module-wide ``path_fitting.DEFAULT_CACHE``).  ``generalizes=False`` says the structured
    expressions have been rejecting the workflows that closed after them (the caller keeps that
    score, ``WorkflowProfile``): a structured expression is then returned as ``candidate`` only,
    and the result is the generic loop, which is what is fitted."""
    keys = [tuple(t) for t in traces]
    if not keys:
        raise ValueError("synthesis needs at least one trace")
    index: dict[Shape, int] = {}  # distinct traces, first seen first
    order = [index.setdefault(k, len(index)) for k in keys]
    shapes = Counter(dict(zip(index, Counter(order).values(), strict=True)))
    work = FitWork()
    if automaton is None:
        automaton = TransitionAutomaton()
        for shape, n in shapes.items():
            automaton.add(shape, n)
    pruned = automaton.pruned(config.prune_threshold)
    allowed = [pruned.allows(shape) for shape in index]
    tokens = [[_token(s) for s in shape] for shape in index]
    dominant = [tokens[i] for i in order if allowed[i]] or [tokens[i] for i in order]
    body = _Synth(config).synth(dominant)
    expr = seq(body, End())
    assert expr is not None
    acceptance = _acceptance(expr, shapes, cache, work)
    structured = acceptance >= config.min_acceptance
    candidate = None
    if structured and not generalizes:
        candidate, structured = expr, False
    if not structured:
        expr = generic_expression(keys, config, cache, work)
        acceptance = _acceptance(expr, shapes, cache, work)
    fitted = fit(expr, shapes, cache=cache)
    work.add(fitted.work)
    work.traces, work.shapes = len(keys), len(shapes)
    return SynthesisResult(expr, fitted.weights, acceptance, structured, len(dominant), work, candidate)
