"""Seeded generators of workflow traces with known structure (steps and timed calls)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np

from clairvoyant.profiler.core.trace import Step, TraceCall

Generator = Callable[[np.random.Generator], list[Step]]


def S(*agents: str) -> Step:
    return Step.of(*agents)


def chain(rng: np.random.Generator) -> list[Step]:
    return [S("a"), S("b"), S("c"), S("d")]


def self_loop(rng: np.random.Generator) -> list[Step]:
    return [S("a"), *[S("b")] * int(rng.integers(2, 6)), S("c")]


def block_loop(rng: np.random.Generator) -> list[Step]:
    body = [S("code"), S("test")] * int(rng.integers(1, 5))
    return [S("plan"), *body, S("report")]


def fan_out(rng: np.random.Generator) -> list[Step]:
    return [S("a"), S(*["b"] * int(rng.integers(2, 5))), S("c")]


def rework(rng: np.random.Generator) -> list[Step]:
    extra = [S("c"), S("b")] if rng.random() < 0.3 else []
    return [S("a"), S("b"), *extra, S("d")]


def listing1(rng: np.random.Generator) -> list[Step]:
    """Pythia Listing 1: planner -> <explorer>{3,4} -> (engineer){3,6} -> reviewer ->
    ((engineer){2,4} -> reviewer)? -> verifier -> $ (rework taken 35% of the time)."""
    steps = [S("planner"), S(*["explorer"] * int(rng.integers(3, 5)))]
    steps += [S("engineer")] * int(rng.integers(3, 7)) + [S("reviewer")]
    if rng.random() < 0.35:
        steps += [S("engineer")] * int(rng.integers(2, 5)) + [S("reviewer")]
    return [*steps, S("verifier")]


EXPECTED = {
    chain: "a -> b -> c -> d -> $",
    self_loop: "a -> (b){2,5} -> c -> $",
    block_loop: "plan -> (code -> test){1,4} -> report -> $",
    fan_out: "a -> <b>{2,4} -> c -> $",
    rework: "a -> b -> (c -> b)? -> d -> $",
    listing1: "planner -> <explorer>{3,4} -> (engineer){3,6} -> reviewer -> ((engineer){2,4} -> reviewer)? -> verifier -> $",
}


def traces(generator: Generator, n: int, seed: int = 0) -> list[list[Step]]:
    rng = np.random.default_rng(seed)
    return [generator(rng) for _ in range(n)]


def timed_calls(
    workflow_id: str,
    steps: list[Step],
    rng: np.random.Generator,
    *,
    start: float = 0.0,
    service: dict[str, float] | None = None,
    gap: float = 0.5,
    lengths: Callable[[str, np.random.Generator], int] | None = None,
) -> list[TraceCall]:
    """Calls that realise ``steps`` in time: a step's calls start together (jittered) and overlap;
    the next step starts ``gap`` seconds after the slowest one ends."""
    service = service or {}
    calls: list[TraceCall] = []
    t = start
    for i, step in enumerate(steps):
        ends = []
        for j, agent in enumerate(step.agents):
            begin = t + 0.01 * j
            duration = service.get(agent, 1.0) * float(rng.uniform(0.8, 1.2))
            out = lengths(agent, rng) if lengths else 100
            calls.append(TraceCall(f"{workflow_id}-{i}-{j}", agent, begin, begin + duration, 50, out))
            ends.append(begin + duration)
        t = max(ends) + gap
    return calls


def sample_word(expr: object, rng: np.random.Generator) -> list[Step]:
    """A random word of ``expr`` with the uniform choices ``PathModel(expr)`` assumes."""
    from clairvoyant.profiler.core.expr import Agent, Alt, End, FanOut, Opt, Repeat, Seq

    out: list[Step] = []

    class _Stop(Exception):
        pass

    def walk(node: object) -> None:
        if isinstance(node, Agent):
            out.append(S(node.name))
        elif isinstance(node, End):
            raise _Stop
        elif isinstance(node, FanOut):
            width = int(rng.integers(node.lo, node.hi + 1))
            out.append(S(*(str(rng.choice(node.members)) for _ in range(width))))
        elif isinstance(node, Seq):
            for item in node.items:
                walk(item)
        elif isinstance(node, Alt):
            walk(node.options[int(rng.integers(len(node.options)))])
        elif isinstance(node, Opt):
            if rng.random() < 0.5:
                walk(node.body)
        elif isinstance(node, Repeat):
            for _ in range(int(rng.integers(node.lo, node.hi + 1))):
                walk(node.body)

    with contextlib.suppress(_Stop):
        walk(expr)
    return out
