"""Local scheduling: which sequences run this step, with how many tokens, and who gets preempted.

Each step has a token budget (``max_num_batched_tokens``) and a seat limit (``max_num_seqs``, or the
global scheduler's knee when it sends a lower one with its placements, ``seat_limit``):

1. running sequences with one uncomputed token (decodes) take one token each, most urgent first;
2. what is left goes to prefill chunks of partially-prefilled and waiting sequences, most urgent
   first; a chunk is ``min(remaining prompt, remaining budget)`` tokens (chunked prefill).

Urgency = (effective priority, earlier arrival, lower seq id), effective priority = base priority +
``aging_rate`` * seconds since arrival.  When blocks run out, the least urgent running sequence is
preempted by recompute: its blocks are released (shared ones just lose a reference, full ones stay in
the prefix cache), it rejoins the waiting queue with its generated tokens, and later recomputes
prompt + output.  A sequence is only ever preempted for a more urgent one; a decode that finds no
less urgent victim preempts itself.

With KV tiers (``core/tiers.py``): a waiting sequence whose L3 prefetch is in flight is held back
as the prefetch policy says, admission first loads what L2 holds of the prompt into L1, and a
victim's blocks are marked for swap or recompute by the cost model.  Background sequences
(pre-prefills) run only in a step that has nothing else to run, and are paused (their computed
whole blocks stay cached) as soon as live work can run.

A ``PriorityRule`` may replace the effective priority (e.g. Autellix's K queues with quanta,
demotion and anti-starvation); the tie-breaks and everything else stay as they are.  Which rule is
installed follows the scheduler preset the requests name (``follow_preset``): a ``rule_factory``
builds each preset's rule once per engine, and a request naming another preset than the installed
one switches the rule for every live sequence, from the next ``schedule`` on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from clairvoyant.worker.core.block_manager import BlockManager
from clairvoyant.worker.core.sequence import Sequence, SequenceStatus
from clairvoyant.worker.core.tiers import KvTiers

Urgency = tuple[float, float, int]


class PriorityRule(Protocol):
    def effective_priority(self, seq: Sequence, now: float) -> float:
        """``seq``'s effective priority at ``now`` (larger = more urgent).  Called for every live
        sequence at every ``schedule``, with ``now`` never decreasing; may keep per-sequence state."""
        ...


RuleFactory = Callable[[str], PriorityRule | None]  # preset name -> its rule; None: base priority + aging


class ScheduledChunk(NamedTuple):
    seq: Sequence
    num_tokens: int  # tokens computed this step, starting at seq.num_computed_tokens


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)  # in batch order
    preempted: list[Sequence] = field(default_factory=list)  # in preemption order
    admitted: list[Sequence] = field(default_factory=list)  # waiting -> running this step
    cached_tokens: int = 0  # prompt positions served from the prefix cache at admission this step


class Scheduler:
    def __init__(
        self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int, aging_rate: float
    ) -> None:
        self.kv = block_manager
        self.max_num_seqs = max_num_seqs
        self.seat_limit = 0  # the scheduler's knee, from the latest placement (0: max_num_seqs alone)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.aging_rate = aging_rate
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.preemptions_total = 0
        self.rule: PriorityRule | None = None  # None: base priority + aging
        self.rule_factory: RuleFactory | None = None  # None: requests' presets are ignored
        self.preset = ""  # the preset whose rule is installed; "" before any request named one
        self._preset_rules: dict[str, PriorityRule | None] = {}  # built once per preset on this engine
        self.tiers: KvTiers | None = None
        self.num_background = 0  # live background sequences (pre-prefills), waiting or running

    def add(self, seq: Sequence) -> None:
        assert seq.status is SequenceStatus.WAITING and not seq.block_table
        self.waiting.append(seq)
        self.num_background += seq.background

    @property
    def seats(self) -> int:
        """Sequences that may run at once: max_num_seqs, or the scheduler's knee when lower."""
        limit = self.seat_limit
        return self.max_num_seqs if limit <= 0 else min(limit, self.max_num_seqs)

    def follow_preset(self, preset: str) -> bool:
        """Install ``preset``'s rule if another one is installed; True when the rule changed.

        ``""`` (a caller that names no preset) and a scheduler without ``rule_factory`` change
        nothing.  The factory runs once per preset: its rule (or None, for a preset without an
        engine rule or one the factory does not know) is kept, so switching back resumes it with
        the per-sequence state it had.  Sequences already here are ranked by the new rule from the
        next ``schedule`` on, as if they had arrived at the switch (a rule first sees them then).
        """
        if not preset or preset == self.preset or self.rule_factory is None:
            return False
        if preset not in self._preset_rules:
            self._preset_rules[preset] = self.rule_factory(preset)
        self.preset = preset
        self.rule = self._preset_rules[preset]
        return True

    def remove(self, seq: Sequence) -> None:
        """Take ``seq`` out of the queues (finish or abort) and release its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.kv.cache_computed_blocks(seq)
            if self.tiers is not None:
                self.tiers.before_free(seq)
            self.kv.free(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        if seq.status is not SequenceStatus.FINISHED:
            self.num_background -= seq.background
        seq.status = SequenceStatus.FINISHED

    def urgency(self, seq: Sequence, now: float) -> Urgency:
        if self.rule is not None:
            return (self.rule.effective_priority(seq, now), -seq.arrival_time, -seq.seq_id)
        effective = seq.priority + self.aging_rate * max(0.0, now - seq.arrival_time)
        return (effective, -seq.arrival_time, -seq.seq_id)

    def schedule(self, now: float) -> SchedulerOutput:
        step = _Step(self, now)
        tiers = self.tiers
        waiting = self.waiting
        if tiers is not None:
            waiting = [s for s in waiting if not tiers.holds_back(s, now)]
        background = [s for s in (*self.running, *waiting) if s.background] if self.num_background else []
        if background:
            live = [s for s in (*self.running, *waiting) if not s.background]
            if live:
                for seq in background:
                    if seq.status is SequenceStatus.RUNNING:
                        self.pause(seq)
            else:  # nothing else can run: the background lane gets the step
                for seq in sorted(background, key=lambda s: (s.arrival_time, s.seq_id)):
                    if step.budget == 0:
                        break
                    if seq.status is SequenceStatus.RUNNING:
                        step.schedule_prefill(seq)
                    elif not step.admit(seq):
                        break
                return step.out
            waiting = [s for s in waiting if not s.background]
        for seq in sorted(self.running, key=step.key, reverse=True):
            if seq.num_uncomputed_tokens == 1 and seq.status is SequenceStatus.RUNNING:
                if step.budget == 0:
                    break
                step.schedule_decode(seq)
        candidates = [s for s in self.running if s.num_uncomputed_tokens > 1] + waiting
        admission_open = True
        for seq in sorted(candidates, key=step.key, reverse=True):
            if step.budget == 0:
                break
            if seq in step.preempted_set:
                continue
            if seq.status is SequenceStatus.RUNNING:
                step.schedule_prefill(seq)
            elif admission_open:
                # Memory is short once a sequence was preempted: admit nothing less urgent than it.
                victim_keys = [step.key(victim) for victim in step.preempted_set]
                admission_open = all(k < step.key(seq) for k in victim_keys) and step.admit(seq)
        return step.out

    def pause(self, seq: Sequence) -> None:
        """Send a running background sequence back to waiting; its whole computed blocks stay
        cached, so it resumes where it was (not a preemption: nothing more urgent was short)."""
        self.running.remove(seq)
        self.kv.cache_computed_blocks(seq)
        self.kv.free(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv.cache_computed_blocks(seq)
        if self.tiers is not None:
            self.tiers.on_preempt(seq)
        self.kv.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.preemptions_total += 1
        self.waiting.append(seq)


class _Step:
    """The bookkeeping of one ``schedule`` call."""

    def __init__(self, scheduler: Scheduler, now: float) -> None:
        self.sched = scheduler
        self.kv = scheduler.kv
        self.now = now
        self.budget = scheduler.max_num_batched_tokens
        self.out = SchedulerOutput()
        self.scheduled: dict[int, ScheduledChunk] = {}  # seq_id -> chunk
        self.preempted_set: set[Sequence] = set()

    def key(self, seq: Sequence) -> Urgency:
        return self.sched.urgency(seq, self.now)

    def schedule_decode(self, seq: Sequence) -> None:
        while not self.kv.allocate(seq, 1):
            victim = self._victim_below(seq)
            self._preempt(victim if victim is not None else seq)
            if victim is None:
                return
        self._add(seq, 1)

    def schedule_prefill(self, seq: Sequence, allow_partial: bool = True) -> bool:
        """Schedule the next prefill chunk of ``seq``, preempting less urgent sequences if that makes
        room; with ``allow_partial``, settle for what fits.  False if nothing was scheduled."""
        num_tokens = min(seq.num_uncomputed_tokens, self.budget)
        needed = self.kv.blocks_needed(seq, num_tokens)
        if needed > self.kv.num_allocatable_blocks and needed <= self._reclaimable_below(seq):
            while not self.kv.allocate(seq, num_tokens):
                victim = self._victim_below(seq)
                assert victim is not None
                self._preempt(victim)
        elif not self.kv.allocate(seq, num_tokens):
            num_tokens = min(num_tokens, self.kv.max_new_tokens(seq)) if allow_partial else 0
            if num_tokens == 0 or not self.kv.allocate(seq, num_tokens):
                return False
        self._add(seq, num_tokens)
        return True

    def admit(self, seq: Sequence) -> bool:
        """Move a waiting ``seq`` to running with its first chunk; False closes admission this step."""
        if len(self.sched.running) >= self.sched.seats:
            victim = self._victim_below(seq)
            if victim is None:
                return False
            self._preempt(victim)
        tiers = self.sched.tiers
        if tiers is not None:
            tiers.before_admit(seq)
        cached = self.kv.match_prefix(seq)
        self.sched.waiting.remove(seq)
        self.sched.running.append(seq)
        seq.status = SequenceStatus.RUNNING
        # A new sequence must get its whole first chunk: a sliver would only hold blocks that the
        # more urgent running sequences are about to need.
        if not self.schedule_prefill(seq, allow_partial=False):
            self.kv.free(seq)
            self.sched.running.remove(seq)
            self.sched.waiting.append(seq)
            seq.status = SequenceStatus.WAITING
            if tiers is not None:
                tiers.not_admitted(seq)
            return False
        # A request's hit counts once, at its first admission (its usage.cached_tokens): after a
        # preemption it finds its own blocks again, and a pre-prefill is cache work, not a request.
        first = seq.cached_tokens is None
        if first:
            seq.cached_tokens = cached
        counted = first and not seq.background
        if tiers is not None:
            tiers.admitted(seq, cached, counted)
        if counted:
            self.out.cached_tokens += min(cached, seq.prompt_len)
        self.out.admitted.append(seq)
        return True

    def _add(self, seq: Sequence, num_tokens: int) -> None:
        chunk = ScheduledChunk(seq, num_tokens)
        self.scheduled[seq.seq_id] = chunk
        self.out.chunks.append(chunk)
        self.budget -= num_tokens

    def _victim_below(self, seq: Sequence) -> Sequence | None:
        """The least urgent running sequence other than ``seq``, if it is less urgent than ``seq``."""
        others = [s for s in self.sched.running if s is not seq]
        if not others:
            return None
        victim = min(others, key=self.key)
        return victim if self.key(victim) < self.key(seq) else None

    def _reclaimable_below(self, seq: Sequence) -> int:
        """Lower bound on the blocks allocatable after preempting everything less urgent than ``seq``."""
        mine = self.key(seq)
        victims = [s for s in self.sched.running if s is not seq and self.key(s) < mine]
        return self.kv.num_allocatable_blocks + sum(self.kv.reclaimable_blocks(s) for s in victims)

    def _preempt(self, seq: Sequence) -> None:
        chunk = self.scheduled.pop(seq.seq_id, None)
        if chunk is not None:
            self.out.chunks.remove(chunk)
            self.budget += chunk.num_tokens
        if seq in self.out.admitted:
            self.out.admitted.remove(seq)
        self.sched.preempt(seq)
        self.out.preempted.append(seq)
        self.preempted_set.add(seq)
