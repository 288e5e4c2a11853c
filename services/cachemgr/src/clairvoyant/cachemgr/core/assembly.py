"""Prompt assembly: a profiler template filled from one workflow's history, up to its ``${new}``.

Each segment names a source sequence and a range of that source's own block chain:

    AGENT[-N]        the N-th most recent finished call of AGENT in the workflow (by start), 1 = latest
    :prompt:[0,e]    its prompt tokens   [0, 16 e)                     P = full prompt blocks
    :response:[0,e]  its prompt+output   [16 P, 16 (P + e))            the response chain continues the prompt's
    static:[0,e]     the agent's static prefix tokens [0, 16 e)        (WorkflowHistory.static_prefix)

        source call:  |-- prompt (P full blocks + tail) --|-- response chain (R blocks) --|
        template:     |-- prompt:[0,$] -------------------|-- response:[0,e] --|

Range ends: ``e`` blocks; ``$`` the whole source (the prompt's or the output's partial tail block
included, since the next prompt carries it on); ``$-d`` all but the last ``d`` full blocks;
``*`` (a prefix whose length varied while learning) is assembled as ``$``, the longest prefix it can
mean: a promotion or pre-prefill of it covers every length the template allowed, and the part the
next prompt does not share shows up as wasted speculative tokens.  A response segment right after the
same call's prompt segment continues from where that one stopped (the tail tokens are not
repeated); elsewhere it starts at its chain's first block, ``16 P``.  An end past the source is cut
to the source.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from clairvoyant.cachemgr.core.history import HistoryCall
from clairvoyant.core.blockhash import BLOCK_TOKENS
from clairvoyant.core.templates import RangeEnd, Template

StaticLookup = Callable[[], tuple[int, ...] | None]


def find_call(calls: Sequence[HistoryCall], agent_id: str, back: int) -> HistoryCall | None:
    """The ``back``-th most recent call of ``agent_id`` in ``calls`` (start order), 1 = the latest."""
    seen = 0
    for call in reversed(calls):
        if call.agent_id == agent_id:
            seen += 1
            if seen == back:
                return call
    return None


def _stop(end: RangeEnd, first_block: int, blocks: int, length: int) -> int:
    """Token offset where a range over ``blocks`` full blocks starting at block ``first_block``
    of a ``length``-token sequence ends."""
    if end.kind in ("all", "any"):
        return length
    count = end.value if end.kind == "blocks" else max(blocks - end.value, 0)
    return min((first_block + min(count, blocks)) * BLOCK_TOKENS, length)


def assemble(
    template: Template, calls: Sequence[HistoryCall], static: StaticLookup
) -> tuple[int, ...] | None:
    """The token ids ``template`` names, from ``calls`` (one workflow's history, start order) and the
    agent's static prefix (``static()``, called only for a ``static`` segment); None when a source is
    missing (a call recorded without token ids counts as missing)."""
    out: list[int] = []
    last: tuple[HistoryCall, int] | None = None  # the call the previous segment read, and where it stopped
    for segment in template.segments:
        if segment.part == "static":
            prefix = static()
            if prefix is None:
                return None
            blocks = len(prefix) // BLOCK_TOKENS
            out.extend(prefix[: _stop(segment.end, 0, blocks, len(prefix))])
            last = None
            continue
        call = find_call(calls, segment.agent, segment.back)
        if call is None or not call.prompt:
            return None  # absent, or recorded without its token ids
        if segment.part == "prompt":
            blocks = len(call.prompt) // BLOCK_TOKENS
            stop = _stop(segment.end, 0, blocks, len(call.prompt))
            out.extend(call.prompt[:stop])
            last = (call, stop)
            continue
        sequence = call.sequence()
        first = len(call.prompt) // BLOCK_TOKENS
        blocks = len(sequence) // BLOCK_TOKENS - first
        start = last[1] if last is not None and last[0] is call else first * BLOCK_TOKENS
        stop = max(_stop(segment.end, first, blocks, len(sequence)), start)
        out.extend(sequence[start:stop])
        last = (call, stop)
    return tuple(out)
