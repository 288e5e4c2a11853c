"""Choice probabilities of a path expression, fitted on traces.

``fit_weights(expr, traces)`` returns a weights table (``path_automaton.Weights``) with an entry,
summing to 1, for every choice point of ``expr``, and for every loop over alternatives whose
transitions some trace shows, its transition rows (``path_automaton.transition_key``: observed
frequencies, all zero for an option never seen) and their ``trust``.  Each trace the expression accepts is parsed
by its most likely derivation (``derivation``, Viterbi-style) and the choices it makes are counted,
with an add-``PRIOR_COUNT`` prior so no admitted path gets probability 0; traces it does not accept
are ignored.  Without traces every choice is uniform.  Never raises on traces; an expression too
large to compile raises ``ExpressionError``.

``fit`` is the same with its cost bounded by the distinct trace shapes rather than the traces:
identical traces are derived once and weighted by their count, and the derivations under uniform
choices are kept in a ``DerivationCache`` across calls (they depend on the expression and the
trace only).  A derivation that is the only one of its trace is final; only ambiguous traces are
derived again under the fitted choices.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from clairvoyant.profiler.core.expr import Alt, Expr, FanOut, Opt, Repeat, Seq
from clairvoyant.profiler.core.path_automaton import (
    PathAutomaton,
    Weights,
    choice_key,
    compile_paths,
    is_chain,
    transition_key,
)
from clairvoyant.profiler.core.trace import Step, StepLike, as_step

PRIOR_COUNT = 0.5
TRANSITION_PRIOR = 1.0  # pseudo-transitions pulling a loop's rows toward its option frequencies
DERIVATION_BEAM = 256  # most automaton states a derivation follows per step

Shape = tuple[Step, ...]
Choices = tuple[tuple[str, int], ...]


class Derivation(NamedTuple):
    choices: Choices  # (weights key, index), in the order the trace makes them
    unique: bool  # the only derivation of the trace: its choices do not depend on the weights


@dataclass
class FitWork:
    """What one fit cost, in operations (never in seconds)."""

    traces: int = 0  # traces given
    shapes: int = 0  # distinct traces among them
    derived: int = 0  # derivations computed (the rest came from the cache)
    cells: int = 0  # (state, next edge) pairs examined by those derivations

    def add(self, other: FitWork) -> None:
        self.traces += other.traces
        self.shapes += other.shapes
        self.derived += other.derived
        self.cells += other.cells


class Fit(NamedTuple):
    weights: Weights
    accepted: int  # traces the expression accepts (counted with multiplicity)
    work: FitWork


class DerivationCache:
    """Derivations under uniform choices, per expression and distinct trace: a pure memo, so one
    cache may serve any number of profiles.  Holds the ``max_expressions`` expressions used last
    and, for each, the ``max_shapes`` traces derived last."""

    def __init__(self, max_expressions: int = 8, max_shapes: int = 4096) -> None:
        self.max_expressions = max_expressions
        self.max_shapes = max_shapes
        self._entries: OrderedDict[Expr, tuple[PathAutomaton, OrderedDict[Shape, Derivation | None]]] = (
            OrderedDict()
        )

    def entry(self, expr: Expr) -> tuple[PathAutomaton, OrderedDict[Shape, Derivation | None]]:
        found = self._entries.get(expr)
        if found is None:
            found = self._entries[expr] = (compile_paths(expr, {}), OrderedDict())
            while len(self._entries) > self.max_expressions:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(expr)
        return found

    def derive(self, expr: Expr, shape: Shape, work: FitWork) -> Derivation | None:
        """The uniform-choice derivation of ``shape`` (None: not accepted), computed at most once."""
        automaton, table = self.entry(expr)
        known = table.get(shape, _UNKNOWN)  # one look-up: a trace's key hashes step by step
        if known is not _UNKNOWN:
            return known  # type: ignore[return-value]
        found, cells = derivation_of(automaton, shape)
        work.derived += 1
        work.cells += cells
        table[shape] = found
        while len(table) > self.max_shapes:
            table.popitem(last=False)
        return found


DEFAULT_CACHE = DerivationCache()
_UNKNOWN = object()


def shapes_of(traces: Iterable[Sequence[StepLike]]) -> Counter[Shape]:
    """The distinct traces with their counts."""
    return Counter(tuple(as_step(s) for s in t) for t in traces)


def fit_weights(expr: Expr, traces: Iterable[Sequence[StepLike]], rounds: int = 2) -> Weights:
    """Choice probabilities of ``expr`` estimated from the traces it accepts (see module doc)."""
    return fit(expr, shapes_of(traces), rounds).weights


def fit(
    expr: Expr, shapes: Mapping[Shape, int], rounds: int = 2, cache: DerivationCache | None = None
) -> Fit:
    """``fit_weights`` over distinct traces with their counts, reusing ``cache`` (default: the
    module's ``DEFAULT_CACHE``)."""
    cache = cache if cache is not None else DEFAULT_CACHE
    work = FitWork(traces=sum(shapes.values()), shapes=len(shapes))
    derived: dict[Shape, Derivation] = {}
    for shape in shapes:
        found = cache.derive(expr, shape, work)
        if found is not None:
            derived[shape] = found
    accepted = sum(shapes[s] for s in derived)
    weights = _weights(expr, derived, shapes)
    ambiguous = [s for s, d in derived.items() if not d.unique]
    for _ in range(max(rounds, 1) - 1):
        if not ambiguous:
            break
        automaton = compile_paths(expr, weights)
        for shape in ambiguous:
            again, cells = derivation_of(automaton, shape)
            work.derived += 1
            work.cells += cells
            if again is not None:
                derived[shape] = again
        weights = _weights(expr, derived, shapes)
    return Fit(weights, accepted, work)


def derivation(automaton: PathAutomaton, steps: Sequence[StepLike]) -> list[tuple[str, int]] | None:
    """The choices (weights key, index) of the most likely derivation of ``steps``; None if the
    automaton does not accept them."""
    found, _ = derivation_of(automaton, tuple(as_step(s) for s in steps))
    return list(found.choices) if found is not None else None


def derivation_of(
    automaton: PathAutomaton, steps: Sequence[Step], beam: int | None = DERIVATION_BEAM
) -> tuple[Derivation | None, int]:
    """``derivation`` with its uniqueness, and the cells examined.  Follows the ``beam`` best
    states per step and, if that loses every derivation, all of them."""
    found, pruned, cells = _viterbi(automaton, steps, beam)
    if found is None and pruned:
        found, _, more = _viterbi(automaton, steps, None)
        cells += more
    return found, cells


# A Viterbi cell: (log score, back pointer, distinct paths capped at 2); back pointer =
# (previous back pointer, choices made on the step).
_Cell = tuple[float, tuple | None, int]


def _viterbi(
    automaton: PathAutomaton, steps: Sequence[Step], beam: int | None
) -> tuple[Derivation | None, bool, int]:
    edges = automaton.edges
    layer: dict[int, _Cell] = {automaton.start: (0.0, None, 1)}
    cells = 0
    pruned = False
    for step in steps:
        agent = step.agents[0] if len(step.agents) == 1 else None
        nxt: dict[int, _Cell] = {}
        for s, (score, back, paths) in layer.items():
            moves = automaton.moves(s)
            candidates = moves.by_agent.get(agent, ()) if agent is not None else ()
            if moves.fans:
                candidates = (*candidates, *moves.fans)
            for e, log_p, choices, n in candidates:
                cells += 1
                edge = edges[e]
                made = choices
                cand = score + log_p
                if edge.fan_key:
                    lk = edge.likelihood(step)
                    if lk <= 0.0:
                        continue
                    cand += math.log(lk)
                    mem_key = edge.fan_key[:-3] + "mem"
                    made = (
                        *choices,
                        (edge.fan_key, len(step.agents) - edge.lo),
                        *((mem_key, edge.members.index(a)) for a in step.agents),
                    )
                held = nxt.get(edge.dst)
                if held is None:
                    nxt[edge.dst] = (cand, (back, made), max(paths, n))
                elif cand > held[0]:
                    nxt[edge.dst] = (cand, (back, made), 2)
                else:
                    nxt[edge.dst] = (held[0], held[1], 2)
        if not nxt:
            return None, pruned, cells
        if beam is not None and len(nxt) > beam:
            pruned = True
            nxt = dict(sorted(nxt.items(), key=lambda item: -item[1][0])[:beam])
        layer = nxt
    best: _Cell | None = None
    for s, (score, back, paths) in layer.items():
        end = automaton.moves(s).end
        if end is None:
            continue
        last: _Cell = (score + end[1], (back, end[2]), max(paths, end[3]))
        if best is not None:  # a second way to the end: ambiguous
            winner = last if last[0] > best[0] else best
            last = (winner[0], winner[1], 2)
        best = last
    if best is None:
        return None, pruned, cells
    return Derivation(_unwind(best[1]), best[2] == 1 and not pruned), pruned, cells


def _unwind(back: tuple | None) -> Choices:
    parts: list[Choices] = []
    while back is not None:
        back, made = back
        parts.append(made)
    return tuple(c for made in reversed(parts) for c in made)


# ------------------------------------------------------------------------------- counting


def _weights(expr: Expr, derived: Mapping[Shape, Derivation], shapes: Mapping[Shape, int]) -> Weights:
    counts: dict[str, dict[int, float]] = {}
    chains = _chain_keys(expr)
    transitions: dict[tuple[int, ...], dict[int | None, Counter[int]]] = {}  # loop -> last -> next
    for shape, found in derived.items():
        weight = float(shapes[shape])
        last: dict[tuple[int, ...], int | None] = {}
        for key, choice in found.choices:
            row = counts.setdefault(key, {})
            row[choice] = row.get(choice, 0.0) + weight
            loop = chains.get(key)
            if loop is None:
                continue
            path, n, is_option = loop
            table = transitions.setdefault(path, {})
            previous = last.get(path)
            table.setdefault(previous, Counter())[choice if is_option else n] += shapes[shape]
            last[path] = choice if is_option else None
    weights: Weights = {}
    for key, size in _choice_sizes(expr).items():
        row = counts.get(key, {})
        values = [row.get(i, 0.0) + PRIOR_COUNT for i in range(size)]
        total = sum(values)
        weights[key] = [v / total for v in values]
    for path, table in transitions.items():
        n = _chain_size(expr, path)
        trust: list[float] = []
        for previous in [*range(n), None]:
            seen = table.get(previous, Counter())
            total = sum(seen.values())
            weights[transition_key(path, previous)] = [
                seen[j] / total if total else 0.0 for j in range(n + 1)
            ]
            trust.append(total / (total + TRANSITION_PRIOR))
        weights[choice_key(path, "trust")] = trust
    return weights


def _chain_keys(expr: Expr) -> dict[str, tuple[tuple[int, ...], int, bool]]:
    """For each loop over alternatives: its option key and its count key -> (loop path, options,
    whether the key picks an option)."""
    keys: dict[str, tuple[tuple[int, ...], int, bool]] = {}
    for path, node in _nodes(expr, ()):
        if is_chain(node):
            assert isinstance(node, Repeat) and isinstance(node.body, Alt)
            n = len(node.body.options)
            keys[choice_key((*path, 0), "alt")] = (path, n, True)
            keys[choice_key(path, "rep")] = (path, n, False)
    return keys


def _chain_size(expr: Expr, path: tuple[int, ...]) -> int:
    node = expr
    for i in path:
        node = _children(node)[i]
    assert isinstance(node, Repeat) and isinstance(node.body, Alt)
    return len(node.body.options)


def _children(node: Expr) -> tuple[Expr, ...]:
    if isinstance(node, Seq):
        return node.items
    if isinstance(node, Alt):
        return node.options
    if isinstance(node, Opt | Repeat):
        return (node.body,)
    return ()


def _nodes(expr: Expr, path: tuple[int, ...]) -> Iterable[tuple[tuple[int, ...], Expr]]:
    yield path, expr
    for i, child in enumerate(_children(expr)):
        yield from _nodes(child, (*path, i))


def _choice_sizes(expr: Expr, path: tuple[int, ...] = ()) -> dict[str, int]:
    sizes: dict[str, int] = {}
    if isinstance(expr, Alt):
        sizes[choice_key(path, "alt")] = len(expr.options)
        for i, o in enumerate(expr.options):
            sizes.update(_choice_sizes(o, (*path, i)))
    elif isinstance(expr, Seq):
        for i, o in enumerate(expr.items):
            sizes.update(_choice_sizes(o, (*path, i)))
    elif isinstance(expr, Opt):
        sizes[choice_key(path, "opt")] = 2
        sizes.update(_choice_sizes(expr.body, (*path, 0)))
    elif isinstance(expr, Repeat):
        sizes[choice_key(path, "rep")] = expr.hi - expr.lo + 1
        sizes.update(_choice_sizes(expr.body, (*path, 0)))
    elif isinstance(expr, FanOut):
        sizes[choice_key(path, "fan")] = expr.hi - expr.lo + 1
        sizes[choice_key(path, "mem")] = len(expr.members)
    return sizes
