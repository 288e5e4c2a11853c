"""Decode runs: many plain decode steps of one batch taken at once, equal to stepping one by one.

When nothing but the steps themselves can change the batch for a while (nothing waits, every
running sequence is decoding, the KV pool has the blocks), the next ``k`` engine steps are fully
determined up to and including the step where the first sequence reaches its length limit: each
sequence gets one token per step, takes a block when it crosses a block boundary and hands a block
to the prefix cache when one fills, and the sequences that reach the limit on the last step
finish.  With a ``FastForwardRunner`` (tokens and step times known without computing them, i.e.
the emulated runner) the engine takes those steps in one call, in O(blocks) work instead of
O(tokens)::

    plan = engine.plan_decode_run()           # None, or k steps and their predicted seconds
    ...                                       # requests added meanwhile just wait
    outputs = engine.advance_decode(plan, n)  # commit the first n <= k steps

Afterwards the state (tokens, block tables and ids, prefix-cache contents and LRU clock, counters)
is what ``n`` calls to ``step()`` leave; tests compare the two (tests/worker/test_engine_decode_runs.py).
Block events keep step order because both the free list and the cache's LRU tie-break depend on it::

    step s:  allocations (batch order) -> forward -> finishes (batch order) -> full blocks cached

The steps before the last go in bulk, in that same order (one ``take``, one in-order insert: see
``_replay_in_bulk``); the last step, where sequences finish, goes event by event.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import NamedTuple

from clairvoyant.worker.core.block_manager import BlockManager
from clairvoyant.worker.core.sequence import Sequence, SequenceStatus

ALLOCATE, FINISH, CACHE = 0, 1, 2  # event kinds, in their order within a step


@dataclass(frozen=True)
class DecodeRun:
    """``num_steps`` decode steps of ``seqs`` (batch order), not yet taken."""

    seqs: tuple[Sequence, ...]
    start_computed: tuple[int, ...]  # each sequence's num_computed_tokens before the first step
    step_seconds: tuple[float, ...]  # the runner's prediction, one per step
    allocations: Allocations  # when the batch takes blocks
    kv_blocks_used_before: int
    kv_blocks_free_before: int

    @property
    def num_steps(self) -> int:
        return len(self.step_seconds)

    def kv_blocks_used_after(self, steps: int) -> int:
        """Blocks in use once the first ``steps`` steps allocated theirs (as ``stats()`` would say).

        Allocating beyond the free list evicts cached-only blocks, which leaves the count unchanged.
        """
        return self.kv_blocks_used_before + min(self.allocations.before(steps), self.kv_blocks_free_before)


class Allocations(NamedTuple):
    """The block allocations of a batch of plain decodes, one block per sequence every
    ``block_size`` steps.  Step ``s`` computes position ``c + s`` of a sequence (``c`` computed
    before), which needs a new block when the table ends there: at steps ``p, p + bs, ...`` with
    phase ``p = len(block_table) * bs - c`` in ``[0, bs)``.  With the phases sorted, round ``r``
    holds the allocations at steps ``[r * bs, (r + 1) * bs)``, one per sequence::

        sorted phases (bs = 4): 0 2 3     allocation k:  0 1 2 | 3 4 5 | ...
                                          at step:       0 2 3 | 4 6 7 | ...
    """

    phases: tuple[int, ...]  # per sequence, in batch order
    sorted_phases: tuple[int, ...]
    block_size: int

    @classmethod
    def of(cls, seqs: Seq[Sequence], block_size: int) -> Allocations | None:
        """None when a table does not end within one block of the computed tokens."""
        phases = tuple(len(seq.block_table) * block_size - seq.num_computed_tokens for seq in seqs)
        ordered = tuple(sorted(phases))
        if not ordered or ordered[0] < 0 or ordered[-1] >= block_size:
            return None
        return cls(phases, ordered, block_size)

    def before(self, step: int) -> int:
        """Allocations at steps before ``step``."""
        rounds, offset = divmod(step, self.block_size)
        return rounds * len(self.sorted_phases) + bisect.bisect_left(self.sorted_phases, offset)

    def step_of(self, k: int) -> int:
        """The step of allocation ``k`` (0-based)."""
        rounds, index = divmod(k, len(self.sorted_phases))
        return rounds * self.block_size + self.sorted_phases[index]


def decode_horizon(seqs: Seq[Sequence], max_steps: int) -> int:
    """Steps until the first of ``seqs`` gets its last token (on the last of them), at most
    ``max_steps``; 0 unless every one is running a plain decode (one uncomputed token) whose text
    needs no stop check.  One pass: it runs before every engine step."""
    horizon = max_steps
    running = SequenceStatus.RUNNING
    for seq in seqs:
        tokens = len(seq.token_ids)
        if seq.status is not running or tokens - seq.num_computed_tokens != 1 or seq.params.stop:
            return 0
        remaining = seq.params.max_tokens - (tokens - seq.prompt_len)
        if remaining < horizon:
            horizon = remaining
    return horizon


def replay_block_events(
    run: DecodeRun, num_steps: int, kv: BlockManager, finished: Seq[bool], finish: Callable[[Sequence], None]
) -> None:
    """Allocate and cache blocks for the first ``num_steps`` steps, in the order ``step()`` would,
    and call ``finish`` for each sequence flagged in ``finished`` after the last step's forward.

    Tokens must already be appended; each sequence's ``num_computed_tokens`` is set per event and
    left at its value after the last step.  The steps before the last one (where nothing
    finishes) go in bulk when they can (``_replay_in_bulk``), the last one event by event.
    """
    phases = _replay_in_bulk(run, num_steps - 1, kv) if num_steps > 1 else None
    if phases is None:
        events = _events(run, num_steps, kv, finished)
    else:
        events = _last_step_events(*phases, num_steps - 1, kv, finished)
    _apply_in_order(run, events, num_steps, kv, finish)


def _replay_in_bulk(run: DecodeRun, num_steps: int, kv: BlockManager) -> tuple[Seq[int], list[int]] | None:
    """The block events of the run's first ``num_steps`` steps (none finishes a sequence) as one
    ``take`` for all allocations and one ``cache_in_order`` for all filled blocks, each in step
    order; returns every sequence's (allocation, fill) phases.  None, changing nothing, where that
    could differ from event by event.

    Step ``s`` computes position ``c + s`` (``c`` = computed tokens before the run).  A sequence
    allocates at steps ``a, a + bs, ...`` and fills a block at steps ``f, f + bs, ...``; with both
    phases in ``[0, bs)``, round ``r`` of either kind is ``[r * bs, (r + 1) * bs)`` and within it
    the events go by (phase, batch index), the same order every round::

        phases (bs = 4):  seq0 a=2, seq1 a=0, seq2 a=3
        allocations:      step 0 seq1, 2 seq0, 3 seq2 | step 4 seq1, 6 seq0, 7 seq2 | ...

    Grouping is exact because the two kinds touch disjoint blocks: allocations evict only blocks no
    sequence holds, and the filled blocks are held by their running sequences.  It needs block
    tables exactly covering the computed tokens plus at most one block (``a < bs``), every block
    computed before the run cached already, and each filled block new content below its parent
    (so no sequence switches to a block cached meanwhile).  The plan checked the first
    (``Allocations.of``), whose phases these are.
    """
    bs = kv.block_size
    seqs, computed = run.seqs, run.start_computed
    allocation_phase = run.allocations.phases
    fill_phase = [bs - 1 - c % bs for c in computed]
    if kv.cache is not None and not _fills_new_content(seqs, computed, fill_phase, num_steps, kv):
        return None
    allocations = _rounds(allocation_phase, num_steps, bs)
    for (index, _), block in zip(allocations, kv.take(len(allocations)), strict=True):
        seqs[index].block_table.append(block)
    if kv.cache is not None:
        kv.cache_in_order((seqs[index], computed[index] // bs + r) for index, r in _rounds(fill_phase, num_steps, bs))
    return allocation_phase, fill_phase


def _fills_new_content(
    seqs: Seq[Sequence], computed: Seq[int], fill_phase: Seq[int], num_steps: int, kv: BlockManager
) -> bool:
    """Whether every sequence has its computed blocks cached and the first block it fills within
    ``num_steps`` steps is new below its parent, and unlike any other's (later ones hang below it)."""
    bs = kv.block_size
    seen: set[tuple[object, ...]] = set()  # (namespace, parent block, content) of the first fills
    for seq, c, phase in zip(seqs, computed, fill_phase, strict=True):
        first = c // bs
        if seq.num_cached_blocks != first:
            return False
        if phase >= num_steps:
            continue
        if not kv.caches_as_new(seq, first, seen):
            return False
    return True


def _rounds(phases: Seq[int], num_steps: int, block_size: int) -> list[tuple[int, int]]:
    """(batch index, round) of every event at steps ``phase + round * block_size < num_steps``, in
    step order (ties by batch index)."""
    order = sorted(range(len(phases)), key=phases.__getitem__)  # stable: ties keep batch order
    ordered_phases = [phases[i] for i in order]
    events: list[tuple[int, int]] = []
    r = 0
    while count := bisect.bisect_left(ordered_phases, num_steps - r * block_size):
        events += [(index, r) for index in order[:count]]
        r += 1
    return events


def _last_step_events(
    allocation_phase: Seq[int], fill_phase: Seq[int], step: int, kv: BlockManager, finished: Seq[bool]
) -> list[tuple[int, int, int]]:
    """The block events of the run's last step ``step`` (the earlier ones went in bulk), in order:
    with phases in ``[0, bs)``, a sequence allocates (fills) a block at ``step`` when its phase is
    ``step % bs``."""
    offset = step % kv.block_size
    events = [(step, ALLOCATE, index) for index, phase in enumerate(allocation_phase) if phase == offset]
    events += [(step, FINISH, index) for index, done in enumerate(finished) if done]
    if kv.cache is not None:
        events += [(step, CACHE, index) for index, phase in enumerate(fill_phase) if phase == offset]
    return events  # already sorted: one step, kinds in order, batch indexes ascending in each


def _events(run: DecodeRun, num_steps: int, kv: BlockManager, finished: Seq[bool]) -> list[tuple[int, int, int]]:
    """The block events of the run's first ``num_steps`` steps, sorted: (step, kind, batch index)."""
    bs, caching = kv.block_size, kv.cache is not None
    events: list[tuple[int, int, int]] = []
    for index, (seq, computed) in enumerate(zip(run.seqs, run.start_computed, strict=True)):
        if finished[index]:
            events.append((num_steps - 1, FINISH, index))
        step = max(0, len(seq.block_table) * bs - computed)
        while step < num_steps:
            events.append((step, ALLOCATE, index))
            step += bs
        if not caching:
            continue
        # ``step()`` caches after every step: at each block boundary, and at step 0 too when blocks
        # computed before the run are not cached yet.
        step = bs - 1 - computed % bs  # the first block boundary
        if (computed + 1) // bs > seq.num_cached_blocks and step > 0:
            events.append((0, CACHE, index))
        while step < num_steps:
            events.append((step, CACHE, index))
            step += bs
    events.sort()
    return events


def _apply_in_order(
    run: DecodeRun,
    events: Seq[tuple[int, int, int]],
    num_steps: int,
    kv: BlockManager,
    finish: Callable[[Sequence], None],
) -> None:
    """Carry out ``events`` one by one, then leave every sequence at its computed tokens after the run."""
    for step, kind, index in events:
        seq, computed = run.seqs[index], run.start_computed[index]
        if kind == ALLOCATE:
            seq.num_computed_tokens = computed + step
            allocated = kv.allocate(seq, 1)
            assert allocated, "the plan checked that the pool holds every block of the run"
        elif kind == FINISH:
            seq.num_computed_tokens = computed + step + 1
            finish(seq)
        elif not seq.is_finished:
            seq.num_computed_tokens = computed + step + 1
            kv.cache_computed_blocks(seq)
    finished = SequenceStatus.FINISHED
    for seq, computed in zip(run.seqs, run.start_computed, strict=True):
        if seq.status is not finished:
            seq.num_computed_tokens = computed + num_steps
