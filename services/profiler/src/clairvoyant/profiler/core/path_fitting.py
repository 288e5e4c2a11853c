"""Choice probabilities of a path expression, fitted on traces.

``fit_weights(expr, traces)`` returns a weights table (``path_automaton.Weights``) with an entry,
summing to 1, for every choice point of ``expr``.  Each trace the expression accepts is parsed by
its most likely derivation (``derivation``, Viterbi-style) and the choices it makes are counted,
with an add-``PRIOR_COUNT`` prior so no admitted path gets probability 0; traces it does not accept
are ignored.  Without traces every choice is uniform.  Never raises on traces; an expression too
large to compile raises ``ExpressionError``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence

from clairvoyant.profiler.core.expr import Alt, Expr, FanOut, Opt, Repeat, Seq
from clairvoyant.profiler.core.path_automaton import FINAL, PathAutomaton, Weights, choice_key, compile_paths
from clairvoyant.profiler.core.trace import StepLike, as_step

PRIOR_COUNT = 0.5

# A Viterbi layer: state -> (log score, back pointer); back pointer = (previous back pointer, choices).
_Layer = dict[int, tuple[float, tuple | None]]


def fit_weights(expr: Expr, traces: Iterable[Sequence[StepLike]], rounds: int = 2) -> Weights:
    """Choice probabilities of ``expr`` estimated from the traces it accepts (see module doc)."""
    data = [list(t) for t in traces]
    weights: Weights = {}
    for _ in range(max(rounds, 1)):
        automaton = compile_paths(expr, weights)
        counts: dict[str, dict[int, float]] = {}
        for steps in data:
            choices = derivation(automaton, steps)
            for key, choice in choices or ():
                row = counts.setdefault(key, {})
                row[choice] = row.get(choice, 0.0) + 1.0
        weights = {}
        for key, size in _choice_sizes(expr).items():
            row = counts.get(key, {})
            weights[key] = [row.get(i, 0.0) + PRIOR_COUNT for i in range(size)]
            total = sum(weights[key])
            weights[key] = [w / total for w in weights[key]]
    return weights


def derivation(automaton: PathAutomaton, steps: Sequence[StepLike]) -> list[tuple[str, int]] | None:
    """The choices (weights key, index) of the most likely derivation of ``steps``; None if the
    automaton does not accept them."""
    observed = [as_step(s) for s in steps]
    layer: _Layer = {automaton.start: (0.0, None)}
    for t in range(len(observed) + 1):
        best = _eps_closure_viterbi(automaton, layer)
        if t == len(observed):
            if FINAL in best:
                return _unwind(best[FINAL][1])
            return None
        nxt: _Layer = {}
        for s, (score, back) in best.items():
            for e in automaton.emits[s]:
                edge = automaton.edges[e]
                lk = edge.likelihood(observed[t])
                if lk <= 0.0:
                    continue
                choice = [(edge.fan_key, len(observed[t].agents) - edge.lo)] if edge.fan_key else []
                if edge.fan_key:
                    choice += [(edge.fan_key[:-3] + "mem", edge.members.index(a)) for a in observed[t].agents]
                cand = score + math.log(lk)
                if edge.dst not in nxt or cand > nxt[edge.dst][0]:
                    nxt[edge.dst] = (cand, (back, choice))
        if not nxt:
            return None
        layer = nxt
    return None


def _eps_closure_viterbi(automaton: PathAutomaton, layer: _Layer) -> _Layer:
    best = dict(layer)
    heap = list(best)
    heapq.heapify(heap)
    done: set[int] = set()
    while heap:
        s = heapq.heappop(heap)
        if s in done:
            continue
        done.add(s)
        score, back = best[s]
        for p, dst, key, choice in automaton.eps[s]:
            if p <= 0.0:
                continue
            cand = score + math.log(p)
            if dst not in best or cand > best[dst][0]:
                best[dst] = (cand, (back, [(key, choice)] if key and choice >= 0 else []))
                if dst != FINAL:
                    heapq.heappush(heap, dst)
    return best


def _unwind(back: tuple | None) -> list[tuple[str, int]]:
    choices: list[tuple[str, int]] = []
    while back is not None:
        back, made = back
        choices.extend(made)
    return choices


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
