"""Hypothesis strategies for path expressions."""

from __future__ import annotations

from hypothesis import strategies as st

from clairvoyant.profiler.core.expr import Agent, Alt, End, FanOut, Opt, Repeat, Seq

NAMES = st.sampled_from(["a", "b", "c", "plan", "x-1", "r.2", "tool:run", "A9"])

fan_bodies = st.one_of(
    NAMES.map(Agent),
    st.lists(NAMES, min_size=2, max_size=3, unique=True).map(lambda ns: Alt(tuple(Agent(n) for n in ns))),
)
fan_outs = st.builds(
    lambda body, lo, extra: FanOut(body, lo, lo + extra), fan_bodies, st.integers(1, 3), st.integers(0, 2)
)
leaves = st.one_of(NAMES.map(Agent), NAMES.map(Agent), fan_outs, st.just(End()))


def _repeat(body: object, lo: int, extra: int) -> Repeat:
    return Repeat(body, lo, max(lo + extra, 1))  # type: ignore[arg-type]


expressions = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, min_size=2, max_size=3).map(lambda xs: Seq(tuple(xs))),
        st.lists(children, min_size=2, max_size=3).map(lambda xs: Alt(tuple(xs))),
        children.map(Opt),
        st.builds(_repeat, children, st.integers(0, 2), st.integers(0, 2)),
    ),
    max_leaves=8,
)
