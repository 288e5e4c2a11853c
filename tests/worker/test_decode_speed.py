"""What a worker says about its decode speed: the cost model's line, or a fit of its timed steps, and
that it reaches the scheduler in the heartbeat."""

from __future__ import annotations

import pytest

from clairvoyant.contracts.v1 import worker_pb2
from clairvoyant.scheduler import convert
from clairvoyant.worker.core.decode_speed import MeasuredSpeed, ModelledSpeed
from clairvoyant.worker.core.engine import EngineConfig, LLMEngine
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.worker.core.types import EngineRequest
from clairvoyant.worker.runners.emulated import EmulatedRunner

pytestmark = pytest.mark.unit


def emulated() -> EmulatedRunner:
    return EmulatedRunner("qwen2.5-7b", "H100-80G", 1, sleep=lambda s: None, distinct_tokens=True)


def test_modelled_speed_is_the_cost_models_line_at_the_mean_context() -> None:
    runner = emulated()
    speed = ModelledSpeed(runner, max_batch=64).speed([3000, 5000])  # mean 4,000 tokens
    assert speed is not None
    for batch in (1, 8, 64):
        step = float(runner.decode_run_seconds([4096] * batch, 1)[0])  # 4,000 rounds to 16 buckets of 256
        assert speed.base_s + speed.per_seq_s * batch == pytest.approx(step, rel=1e-6)
    longer = ModelledSpeed(runner, max_batch=64).speed([16_000])
    assert longer is not None and longer.per_seq_s > 2 * speed.per_seq_s  # KV reads grow with context
    assert longer.base_s == pytest.approx(speed.base_s, rel=1e-6)  # the weights do not


def test_modelled_speed_keeps_its_last_answer_when_nothing_runs() -> None:
    model = ModelledSpeed(emulated(), max_batch=16)
    assert model.speed([]) is None
    first = model.speed([1000])
    assert model.speed([]) == first


def test_measured_speed_recovers_a_line_from_timed_steps() -> None:
    fit = MeasuredSpeed()
    fit.observe(4, 0.02 + 0.003 * 4)
    assert fit.speed() is None  # one batch size says nothing about the slope
    fit.observe(5, 0.02 + 0.003 * 5)
    assert fit.speed() is None  # nor do sizes closer than MIN_SPREAD
    for batch in (1, 8, 16, 3, 12):
        fit.observe(batch, 0.02 + 0.003 * batch)
    speed = fit.speed()
    assert speed is not None
    assert speed.base_s == pytest.approx(0.02) and speed.per_seq_s == pytest.approx(0.003)


def test_measured_speed_forgets_old_steps() -> None:
    fit = MeasuredSpeed(forgetting=0.9)
    for batch in (1, 4, 8) * 20:
        fit.observe(batch, 0.01 + 0.001 * batch)
    for batch in (1, 4, 8) * 40:  # contexts grew: each sequence costs five times as much
        fit.observe(batch, 0.01 + 0.005 * batch)
    speed = fit.speed()
    assert speed is not None and speed.per_seq_s == pytest.approx(0.005, rel=0.01)


def test_measured_speed_refuses_a_bad_forgetting_factor() -> None:
    with pytest.raises(ValueError, match="forgetting"):
        MeasuredSpeed(forgetting=0.0)


def test_engine_reports_its_speed_and_the_scheduler_reads_it() -> None:
    runner = emulated()
    engine = LLMEngine(runner, EngineConfig(block_size=16, num_blocks=4096, max_num_seqs=32))
    assert engine.stats().decode_speed is None  # nothing has run: no context to price
    for i in range(4):
        engine.add_request(EngineRequest(f"r{i}", [1 + (i + t) % 200 for t in range(2000)], SamplingParams(max_tokens=8)))
    engine.step()
    speed = engine.stats().decode_speed
    assert speed is not None and speed.per_seq_s > 0 and speed.base_s > 0
    stats = worker_pb2.WorkerStats(
        worker_id="w", model="m", max_batch=32, decode_base_s=speed.base_s, decode_per_seq_s=speed.per_seq_s
    )
    report = convert.worker_report(stats)
    assert (report.decode_base_s, report.decode_per_seq_s) == (speed.base_s, speed.per_seq_s)
