"""Templates: the parser (libs/core) and assembly from a workflow's history, checked against the
profiler's own ``describe`` on a real multi-call chain."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from clairvoyant.cachemgr.core.assembly import assemble
from clairvoyant.cachemgr.core.history import WorkflowHistory
from clairvoyant.core.blockhash import BLOCK_TOKENS, chain_hashes, sequence_hashes
from clairvoyant.core.templates import RangeEnd, Segment, Template, TemplateSyntaxError, parse
from clairvoyant.profiler.core.templates import (
    ChainStore,
    TemplateConfig,
    common_prefix,
    describe,
    static_run,
)
from tests.cachemgr.factories import call

pytestmark = pytest.mark.unit

VOCAB = 32_000


def fresh(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(0, VOCAB, n).tolist()


# ---- parsing ------------------------------------------------------------------------------------


def test_parse_reads_every_source_and_range_end() -> None:
    text = (
        "${static:[0,$]}${coder[-2]:prompt:[0,$-3]}${coder[-2]:response:[0,64]}${a:b[-1]:prompt:[0,*]}${new}"
    )
    assert parse(text) == Template(
        (
            Segment("", 0, "static", RangeEnd("all")),
            Segment("coder", 2, "prompt", RangeEnd("all_but", 3)),
            Segment("coder", 2, "response", RangeEnd("blocks", 64)),
            Segment("a:b", 1, "prompt", RangeEnd("any")),
        )
    )
    assert parse(text).text() == text
    assert parse("${new}") == Template(())


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ("", 0),  # no ${new}
        ("${coder[-1]:prompt:[0,$]}", 25),  # no ${new}
        ("${coder[-0]:prompt:[0,$]}${new}", 9),  # [-0]
        ("${coder[-1]:reply:[0,$]}${new}", 12),
        ("${coder[-1]:prompt:[1,$]}${new}", 19),  # ranges start at 0
        ("${coder[-1]:prompt:[0,x]}${new}", 22),
        ("${coder:prompt:[0,$]}${new}", 2),  # no [-N]
        ("${static:[0,$]}${new}trailing", 21),
        ("${new}${new}", 6),
    ],
)
def test_parse_errors_name_the_position(text: str, position: int) -> None:
    with pytest.raises(TemplateSyntaxError) as caught:
        parse(text)
    assert caught.value.position == position
    assert f"position {position}" in str(caught.value)
    assert isinstance(caught.value, ValueError)


# ---- assembly against the profiler's describe ---------------------------------------------------


def codegen(rng: np.random.Generator, system: list[int]) -> list[tuple[str, list[int], list[int]]]:
    """planner -> coder x3 (a conversation) -> summarizer (the last coder prompt + 64 reply blocks)
    -> retry (all but the last 2 blocks of the summarizer's prompt)."""
    calls: list[tuple[str, list[int], list[int]]] = []
    prompt, reply = system + fresh(rng, 37), fresh(rng, 250)
    calls.append(("planner", prompt, reply))
    for turn in range(3):
        base = prompt + reply
        extra = 40 + (-(len(base) + 40)) % BLOCK_TOKENS if turn == 2 else 53
        prompt, reply = base + fresh(rng, extra), fresh(rng, 1100 + 37 * turn)
        calls.append(("coder", prompt, reply))
    summary = prompt + reply[:1024] + fresh(rng, 40)
    calls.append(("summarizer", summary, fresh(rng, 80)))
    full = len(summary) // BLOCK_TOKENS
    calls.append(("retry", summary[: (full - 2) * BLOCK_TOKENS] + fresh(rng, 20), fresh(rng, 10)))
    return calls


def test_assembly_reproduces_the_prefix_describe_found() -> None:
    rng = np.random.default_rng(7)
    system = fresh(rng, 170)  # 10 full blocks + 10 tokens
    instances = [codegen(rng, system) for _ in range(3)]
    static: dict[str, Sequence[int]] = {
        "planner": static_run([chain_hashes(i[0][1]) for i in instances[:2]], 0.5)
    }
    assert len(static["planner"]) == 10
    history = WorkflowHistory()
    for n, instance in enumerate(instances[:2]):  # two earlier instances teach the static prefix
        history.record(
            call(f"old{n}", instance[0][1], instance[0][2], workflow_id=f"old{n}", agent_id="planner"), 0.0
        )

    calls = instances[2]
    store = ChainStore(TemplateConfig())
    for i, (agent, prompt, reply) in enumerate(calls):
        prompt_blocks, response_blocks = sequence_hashes(prompt, reply)
        store.add(f"r{i}", agent, float(i), prompt_blocks, response_blocks)
    descriptions = describe(store.calls(), static)
    preferred = [(agent, min(d.spellings)[1]) for agent, d in descriptions]
    assert preferred == [
        ("planner", "${static:[0,$]}${new}"),
        ("coder", "${planner[-1]:prompt:[0,$]}${planner[-1]:response:[0,$]}${new}"),
        ("coder", "${coder[-1]:prompt:[0,$]}${coder[-1]:response:[0,$]}${new}"),
        ("coder", "${coder[-1]:prompt:[0,$]}${coder[-1]:response:[0,$]}${new}"),
        ("summarizer", "${coder[-1]:prompt:[0,$]}${coder[-1]:response:[0,64]}${new}"),
        ("retry", "${summarizer[-1]:prompt:[0,242]}${new}"),  # absolute before $-2 (it spells both)
    ]
    assert [text for _, text in descriptions[5][1].spellings] == [
        "${summarizer[-1]:prompt:[0,242]}${new}",
        "${summarizer[-1]:prompt:[0,$-2]}${new}",
    ]

    chains = store.calls()
    for i, (agent, prompt, _) in enumerate(calls):
        prompt_blocks = chain_hashes(prompt)
        matched = max(
            [common_prefix(prompt_blocks, c.chain) for c in chains[:i]]
            + [common_prefix(prompt_blocks, static.get(agent, ()))]
        )
        shape, spellings = descriptions[i][1]
        held = history.calls("t", "w")
        static_of = lambda a=agent: history.static_prefix("t", "type", a)  # noqa: E731
        for _, spelled in spellings:
            got = assemble(parse(spelled), held, static_of)
            assert got is not None, spelled
            assert list(got) == prompt[: len(got)], spelled  # a prefix of the real prompt...
            assert len(got) // BLOCK_TOKENS == matched, spelled  # ...of exactly the blocks describe matched
        # The shape's "*" assembles the whole source: at least the matched blocks, maybe more.
        got = assemble(parse(shape), held, static_of)
        assert got is not None
        assert chain_hashes(got)[:matched] == prompt_blocks[:matched]
        assert len(got) >= matched * BLOCK_TOKENS
        history.record(
            call(f"r{i}", prompt, calls[i][2], workflow_id="w", agent_id=agent, start=float(i)), float(i)
        )
    assert matched == 242

    # Exact lengths, spelled out for the interesting cases (history now holds all six calls).
    calls_held = history.calls("t", "w")
    coder3_prompt, coder3_reply = calls[3][1], calls[3][2]
    got = assemble(
        parse("${coder[-1]:prompt:[0,$]}${coder[-1]:response:[0,64]}${new}"), calls_held, lambda: None
    )
    assert got == tuple(coder3_prompt + coder3_reply[:1024])  # the prompt ends on a block boundary
    got = assemble(parse("${coder[-2]:prompt:[0,3]}${new}"), calls_held, lambda: None)
    assert got == tuple(calls[2][1][:48])
    summary = calls[4][1]
    got = assemble(parse("${summarizer[-1]:prompt:[0,$-2]}${new}"), calls_held, lambda: None)
    assert got == tuple(summary[: (len(summary) // BLOCK_TOKENS - 2) * BLOCK_TOKENS])
    planner_prompt, planner_reply = calls[0][1], calls[0][2]
    # A response range continues the prompt's partial tail block: 207 prompt tokens (12 blocks + 15)
    # then the response chain's first block ends at token 208.
    assert len(planner_prompt) == 207
    got = assemble(
        parse("${planner[-1]:prompt:[0,$]}${planner[-1]:response:[0,1]}${new}"), calls_held, lambda: None
    )
    assert got == tuple((planner_prompt + planner_reply)[:208])
    got = assemble(
        parse("${planner[-1]:response:[0,2]}${new}"), calls_held, lambda: None
    )  # alone: its own blocks
    assert got == tuple((planner_prompt + planner_reply)[192:224])


def test_a_missing_source_assembles_to_none() -> None:
    history = WorkflowHistory()
    history.record(call("r1", list(range(64)), list(range(20)), agent_id="coder"), 1.0)
    calls = history.calls("t", "w1")
    assert assemble(parse("${coder[-1]:prompt:[0,2]}${new}"), calls, lambda: None) == tuple(range(32))
    assert assemble(parse("${coder[-2]:prompt:[0,2]}${new}"), calls, lambda: None) is None
    assert assemble(parse("${planner[-1]:prompt:[0,2]}${new}"), calls, lambda: None) is None
    assert assemble(parse("${static:[0,$]}${new}"), calls, lambda: None) is None
    assert assemble(parse("${new}"), calls, lambda: None) == ()
    # An end past the source is cut to the source.
    assert assemble(parse("${coder[-1]:prompt:[0,99]}${new}"), calls, lambda: None) == tuple(range(64))
