"""Chunked prefill, priority order, aging and preemption by recompute."""

from __future__ import annotations

import pytest

from clairvoyant.worker.core.engine import EngineRequest, LLMEngine
from clairvoyant.worker.core.sequence import Sequence
from tests.worker.fakes import Clock, Collected, collect, drain, letters, make_engine, request

pytestmark = pytest.mark.unit


def test_chunked_prefill_takes_four_steps_and_matches_unchunked() -> None:
    chunked, runner = make_engine(block_size=16, num_blocks=64, max_num_batched_tokens=32)
    whole, _ = make_engine(block_size=16, num_blocks=64)
    prompt = letters(100, seed=11)
    for engine in (chunked, whole):
        engine.add_request(request("r", prompt, max_tokens=6))

    steps_without_output = 0
    while not (outputs := chunked.step()):
        steps_without_output += 1
        chunked.check_integrity()
    assert steps_without_output == 3  # the 4th step yields the first token
    assert [out.new_token_ids for out in outputs] and outputs[0].completion_tokens == 1
    assert [call[0][1:] for call in runner.calls] == [
        (32, 0, False),
        (32, 32, False),
        (32, 64, False),
        (4, 96, True),
    ]

    results: dict[str, Collected] = {}
    collect(outputs, results)
    drain(chunked, results)
    assert results["r"].token_ids == drain(whole)["r"].token_ids
    assert chunked.stats().computed_prompt_tokens_total == 100


def test_decodes_come_first_and_prefill_gets_the_rest_of_the_budget() -> None:
    engine, runner = make_engine(block_size=16, num_blocks=64, max_num_batched_tokens=20)
    engine.add_request(request("short", letters(5, seed=1), max_tokens=4))
    engine.step()  # short's prefill (5 tokens) and first token
    engine.add_request(request("long", letters(50, seed=2), max_tokens=2))
    engine.step()
    # short decodes 1 token; long gets the 19 left in the budget.
    assert [(n, start, logits) for _, n, start, logits in runner.calls[-1]] == [(1, 5, True), (19, 0, False)]


def _admission_order(engine: LLMEngine, clock: Clock, requests: list[EngineRequest]) -> list[str]:
    for req in requests:
        engine.add_request(req)
    order: list[str] = []
    while engine.has_unfinished():
        for out in engine.step():
            if out.completion_tokens == 1:
                order.append(out.request_id)
        clock.now += 1.0
    return order


def test_waiting_queue_runs_by_priority_then_arrival() -> None:
    clock = Clock(100.0)
    engine, _ = make_engine(clock=clock, block_size=4, num_blocks=64, max_num_seqs=1)
    reqs = [
        request("a", letters(6, 1), max_tokens=2, priority=0.0, arrival_time=0.0),
        request("b", letters(6, 2), max_tokens=2, priority=5.0, arrival_time=1.0),
        request("c", letters(6, 3), max_tokens=2, priority=1.0, arrival_time=2.0),
        request("d", letters(6, 4), max_tokens=2, priority=5.0, arrival_time=3.0),
    ]
    assert _admission_order(engine, clock, reqs) == ["b", "d", "c", "a"]


@pytest.mark.parametrize(
    ("aging_rate", "expected"), [(0.0, ["high", "old"]), (0.1, ["high", "old"]), (1.0, ["old", "high"])]
)
def test_aging_lets_an_old_low_priority_request_overtake(aging_rate: float, expected: list[str]) -> None:
    # At t=10: old has waited 10 s (effective 0 + 10 * rate), high has just arrived (effective 5).
    clock = Clock(10.0)
    engine, _ = make_engine(clock=clock, block_size=4, num_blocks=64, max_num_seqs=1, aging_rate=aging_rate)
    reqs = [
        request("old", letters(6, 1), max_tokens=2, priority=0.0, arrival_time=0.0),
        request("high", letters(6, 2), max_tokens=2, priority=5.0, arrival_time=10.0),
    ]
    assert _admission_order(engine, clock, reqs) == expected


@pytest.mark.parametrize(
    ("specs", "victim"),
    [
        ([("x", 1.0, 0.0), ("y", 1.0, 1.0), ("z", 0.0, 2.0)], "z"),  # lowest priority
        ([("x", 1.0, 0.0), ("y", 1.0, 1.0), ("z", 2.0, 2.0)], "y"),  # tie on priority: latest arrival
        ([("x", 3.0, 5.0), ("y", 2.0, 0.0), ("z", 1.0, 0.0)], "z"),
    ],
)
def test_preemption_victim_is_least_urgent_running(
    specs: list[tuple[str, float, float]], victim: str
) -> None:
    # 3 prompts of 8 tokens fill the 6-block pool exactly; the first decode step needs 3 more blocks.
    engine, _ = make_engine(block_size=4, num_blocks=6, enable_prefix_cache=False)
    for i, (rid, priority, arrival) in enumerate(specs):
        engine.add_request(request(rid, letters(8, i), max_tokens=4, priority=priority, arrival_time=arrival))
    engine.step()
    assert engine.stats().running == 3 and engine.stats().kv_blocks_used == 6
    engine.step()
    assert [s.request_id for s in engine.last_schedule.preempted] == [victim]
    assert engine.stats().preemptions_total == 1
    engine.check_integrity()


def test_waiting_request_preempts_only_less_urgent_running() -> None:
    engine, _ = make_engine(block_size=4, num_blocks=8, enable_prefix_cache=False)
    results: dict[str, Collected] = {}
    engine.add_request(request("mid", letters(20, 1), max_tokens=8, priority=5.0))
    collect(engine.step(), results)  # 20 tokens -> 5 blocks, 3 left
    engine.add_request(request("low", letters(16, 2), max_tokens=2, priority=0.0))
    collect(engine.step(), results)  # low needs 4 blocks: must not displace mid
    assert engine.stats().preemptions_total == 0
    assert [s.request_id for s in engine.scheduler.waiting] == ["low"]
    engine.add_request(request("high", letters(16, 3), max_tokens=2, priority=9.0))
    collect(engine.step(), results)  # high needs 4 blocks: preempts mid, and low must not jump mid
    assert [s.request_id for s in engine.last_schedule.preempted] == ["mid"]
    assert [s.request_id for s in engine.scheduler.running] == ["high"]
    assert [s.request_id for s in engine.scheduler.waiting] == ["low", "mid"]
    engine.check_integrity()
    drain(engine, results)
    assert {rid: r.final.finish_reason for rid, r in results.items()} == dict.fromkeys(results, "length")
    assert [len(results[r].token_ids) for r in ("mid", "low", "high")] == [8, 2, 2]


@pytest.mark.parametrize("enable_prefix_cache", [True, False])
def test_preemption_by_recompute_reproduces_unpreempted_tokens(enable_prefix_cache: bool) -> None:
    shared = letters(8, seed=99)

    def requests() -> list[EngineRequest]:
        return [
            request(
                f"r{i}",
                shared + letters(4 + i, seed=i),
                max_tokens=20,
                temperature=0.0 if i % 2 else 0.9,
                seed=i,
                priority=float(i % 3),
                arrival_time=float(i),
            )
            for i in range(5)
        ]

    tiny, _ = make_engine(block_size=4, num_blocks=12, enable_prefix_cache=enable_prefix_cache)
    roomy, _ = make_engine(block_size=4, num_blocks=256, enable_prefix_cache=enable_prefix_cache)
    for engine in (tiny, roomy):
        for req in requests():
            engine.add_request(req)
    got, want = drain(tiny), drain(roomy)
    assert {rid: c.token_ids for rid, c in got.items()} == {rid: c.token_ids for rid, c in want.items()}
    assert {rid: c.text for rid, c in got.items()} == {rid: c.text for rid, c in want.items()}
    assert tiny.stats().preemptions_total > 0
    assert roomy.stats().preemptions_total == 0
    assert all(len(c.token_ids) == 20 for c in got.values())
    stats = tiny.stats()
    assert stats.kv_blocks_used == stats.kv_blocks_cached
    # A re-admitted request finds its own blocks again (with the cache on, the tiny engine's
    # re-admissions hit 104 tokens): the engine counts each request's hit once, the one its usage
    # reports, so the hit ratio stays a share of the prompts.
    for engine, results in ((tiny, got), (roomy, want)):
        assert engine.stats().cached_prompt_tokens_total == sum(c.final.cached_tokens for c in results.values())


def test_waiting_request_preempts_less_urgent_running_when_seats_run_out() -> None:
    # Autellix's engine-side preemption: batch full, a call of a program with less attained
    # service (higher base priority) takes the seat of one with more; the victim resumes after.
    clock = Clock(0.0)
    engine, _ = make_engine(clock=clock, block_size=4, num_blocks=64, max_num_seqs=1)
    results: dict[str, Collected] = {}
    engine.add_request(request("long-program", letters(6, 1), max_tokens=4, priority=-5.0))
    collect(engine.step(), results)
    clock.now = 1.0
    engine.add_request(request("short-program", letters(6, 2), max_tokens=2, priority=0.0))
    collect(engine.step(), results)
    assert [s.request_id for s in engine.last_schedule.preempted] == ["long-program"]
    assert [s.request_id for s in engine.scheduler.running] == ["short-program"]
    engine.check_integrity()
    drain(engine, results)
    assert [len(results[r].token_ids) for r in ("long-program", "short-program")] == [4, 2]
    assert engine.stats().preemptions_total == 1


def test_the_schedulers_seat_limit_holds_the_batch_at_the_knee() -> None:
    # Admission at the knee: the placement says 2 seats on an engine of 8.  A third, more urgent
    # call takes the seat of the least urgent running one; a less urgent fourth waits.
    clock = Clock(0.0)
    engine, _ = make_engine(clock=clock, block_size=4, num_blocks=64, max_num_seqs=8)
    results: dict[str, Collected] = {}
    for rid, priority in (("low", -2.0), ("mid", -1.0)):
        engine.add_request(request(rid, letters(6, len(rid)), max_tokens=4, priority=priority, seat_limit=2))
    collect(engine.step(), results)
    assert engine.scheduler.seats == 2 and len(engine.scheduler.running) == 2
    clock.now = 1.0
    engine.add_request(request("urgent", letters(6, 9), max_tokens=2, priority=0.0, seat_limit=2))
    engine.add_request(request("lowest", letters(6, 8), max_tokens=2, priority=-3.0, seat_limit=2))
    collect(engine.step(), results)
    assert [s.request_id for s in engine.last_schedule.preempted] == ["low"]
    assert sorted(s.request_id for s in engine.scheduler.running) == ["mid", "urgent"]
    while engine.has_unfinished():
        collect(engine.step(), results)
        assert len(engine.scheduler.running) <= 2
        engine.check_integrity()
    assert [len(results[r].token_ids) for r in ("low", "mid", "urgent", "lowest")] == [4, 4, 2, 2]


def test_no_seat_limit_leaves_max_num_seqs() -> None:
    engine, _ = make_engine(block_size=4, num_blocks=64, max_num_seqs=3)
    engine.add_request(request("a", letters(6, 1), max_tokens=2, seat_limit=0))
    assert engine.scheduler.seats == 3
    engine.add_request(request("b", letters(6, 2), max_tokens=2, seat_limit=10))
    assert engine.scheduler.seats == 3  # a knee above the engine's own seats changes nothing


class _ByOutputLength:
    """A PriorityRule: fewer generated tokens = more urgent (least attained service per call)."""

    def effective_priority(self, seq: Sequence, now: float) -> float:
        return -float(seq.num_output_tokens)


def test_a_priority_rule_replaces_base_priority_and_aging() -> None:
    clock = Clock(0.0)
    engine, _ = make_engine(clock=clock, block_size=4, num_blocks=64, max_num_seqs=1, aging_rate=100.0)
    engine.scheduler.rule = _ByOutputLength()
    engine.add_request(request("a", letters(6, 1), max_tokens=3, priority=9.0, arrival_time=0.0))
    engine.add_request(request("b", letters(6, 2), max_tokens=3, priority=0.0, arrival_time=0.0))
    ran: list[str] = []
    while engine.has_unfinished():
        ran += [out.request_id for out in engine.step()]
        clock.now += 1.0
        engine.check_integrity()
    # Without the rule "a" (priority 9) would run to the end first; with it they alternate, the
    # earlier arrival (lower seq id) winning each tie.
    assert ran == ["a", "b", "a", "b", "a", "b"]
