"""The roofline cost model: physical sanity of each term, and the calibration against published numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from clairvoyant.worker.costmodel.calibration import (
    POINTS,
    TOLERANCE,
    PublishedPoint,
    markdown_table,
    relative_error,
)
from clairvoyant.worker.costmodel.gpus import A100_80G, GPUS, H100_80G, get_gpu
from clairvoyant.worker.costmodel.models import LLAMA_31_8B, LLAMA_31_70B, MODELS, QWEN25_7B, get_model
from clairvoyant.worker.costmodel.roofline import RUNTIME_RESERVE_BYTES, BatchItem, CostModel

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[2] / "docs" / "costmodel.md"


def h100_8b(tp: int = 1, **kwargs: float) -> CostModel:
    return CostModel(H100_80G, LLAMA_31_8B, tp, **kwargs)


@pytest.mark.parametrize(
    ("name", "billions"),
    [("llama-3.1-8b", 8.03), ("llama-3.1-70b", 70.55), ("qwen2.5-7b", 7.62), ("qwen2.5-14b", 14.77),
     ("qwen2.5-32b", 32.76), ("llama-2-7b", 6.74), ("llama-2-70b", 68.98)],
)
def test_parameter_counts_match_the_published_model_sizes(name: str, billions: float) -> None:
    assert MODELS[name].params / 1e9 == pytest.approx(billions, abs=0.005)


def test_kv_bytes_per_token_follow_the_architecture() -> None:
    assert LLAMA_31_8B.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2 == 131_072
    assert LLAMA_31_70B.kv_bytes_per_token() == 2 * 80 * 8 * 128 * 2
    assert QWEN25_7B.kv_bytes_per_token() == 2 * 28 * 4 * 128 * 2
    # Tensor parallelism splits the KV heads; past one head per GPU each GPU keeps a replica.
    assert CostModel(H100_80G, LLAMA_31_70B, 4).kv_bytes_per_token_per_gpu == LLAMA_31_70B.kv_bytes_per_token() // 4
    assert CostModel(H100_80G, LLAMA_31_70B, 16).kv_bytes_per_token_per_gpu == 2 * 80 * 1 * 128 * 2


def test_flops_per_token_is_two_per_weight_plus_attention() -> None:
    matmul = LLAMA_31_8B.params - LLAMA_31_8B.head_params  # the embedding gather does no FLOPs
    assert LLAMA_31_8B.flops_per_token(0) == pytest.approx(2 * matmul)
    assert LLAMA_31_8B.flops_per_token(4096) - LLAMA_31_8B.flops_per_token(0) == 4 * 32 * 4096 * 4096


def test_decode_of_batch_one_is_memory_bound_at_weight_bytes_over_bandwidth() -> None:
    step = h100_8b().step_cost([BatchItem(1, 511)])
    assert not step.compute_bound
    floor = LLAMA_31_8B.weight_bytes / H100_80G.hbm_bandwidth  # ~4.8 ms at the datasheet's peak
    assert step.memory_seconds == pytest.approx(floor / H100_80G.mbu, rel=0.08)  # no embedding, + KV
    assert floor < step.seconds < floor / H100_80G.mbu * 1.1 + H100_80G.step_overhead
    assert 0.004 < step.seconds < 0.010


def test_prefill_of_2k_tokens_is_compute_bound() -> None:
    step = h100_8b().step_cost([BatchItem(2048)])
    assert step.compute_bound and step.compute_seconds > 10 * step.memory_seconds
    flops = sum(LLAMA_31_8B.flops_per_token(k) for k in range(1, 2049)) - 2047 * 2 * LLAMA_31_8B.head_params
    assert step.flops == pytest.approx(flops, rel=1e-9)  # lm_head only for the last position
    assert step.compute_seconds == pytest.approx(flops / (H100_80G.bf16_flops * H100_80G.mfu))


def test_tensor_parallel_two_halves_the_weight_time_and_adds_all_reduces() -> None:
    one, two = h100_8b(1).step_cost([BatchItem(1, 99)]), h100_8b(2).step_cost([BatchItem(1, 99)])
    assert two.memory_seconds / one.memory_seconds == pytest.approx(0.5, rel=0.01)
    assert two.communication_seconds == pytest.approx(2 * 32 * (H100_80G.allreduce_latency + 8192 / 450e9), rel=1e-6)
    assert 0.5 < two.seconds / one.seconds < 0.75


def test_cached_context_costs_attention_reads_and_prefix_hits_save_compute() -> None:
    cost = h100_8b()
    long, short = cost.step_cost([BatchItem(1, 32_000)]), cost.step_cost([BatchItem(1, 100)])
    assert long.bytes - short.bytes == (32_000 - 100) * 131_072  # 4.2 GB of K/V read back
    assert long.seconds > 1.2 * short.seconds
    full, hit = cost.step_cost([BatchItem(2048)]), cost.step_cost([BatchItem(64, 1984)])
    assert hit.compute_seconds < full.compute_seconds / 25 and hit.seconds < full.seconds / 5
    assert cost.step_time([2048], [100, 200]) == cost.step_cost([BatchItem(2048), BatchItem(1, 99), BatchItem(1, 199)]).seconds
    assert cost.step_cost([]).seconds == 0.0


def test_overlap_one_is_the_classic_roofline() -> None:
    step = h100_8b(overlap=1.0).step_cost([BatchItem(256)])
    assert step.seconds == pytest.approx(max(step.compute_seconds, step.memory_seconds) + H100_80G.step_overhead)
    additive = h100_8b().step_cost([BatchItem(256)])
    assert additive.seconds == pytest.approx(step.compute_seconds + step.memory_seconds + H100_80G.step_overhead)


def test_kv_capacity_of_8b_on_h100_is_memory_left_after_weights() -> None:
    tokens = h100_8b().kv_capacity_tokens(0.9)
    assert 400_000 <= tokens <= 500_000
    expected = (0.9 * H100_80G.hbm_bytes - LLAMA_31_8B.weight_bytes - RUNTIME_RESERVE_BYTES) // 131_072
    assert tokens == expected
    assert h100_8b().kv_capacity_tokens(0.5) < tokens


def test_70b_needs_more_than_one_gpu() -> None:
    assert CostModel(H100_80G, LLAMA_31_70B, 1).kv_capacity_tokens() == 0
    two, four = (CostModel(H100_80G, LLAMA_31_70B, tp).kv_capacity_tokens() for tp in (2, 4))
    assert 0 < two < 100_000 < four


def test_transfers_and_startup() -> None:
    cost, cost_tp2 = h100_8b(1), h100_8b(2)
    gib = 2**30
    assert cost.swap_time(gib) == pytest.approx(gib / (64e9 * 0.8), rel=0.01)
    assert cost_tp2.swap_time(gib) == pytest.approx(cost.swap_time(gib) / 2, rel=0.01)
    assert cost.swap_time(0) == 0.0 and cost.migration_time(0) == 0.0
    assert cost.kv_bytes(1000) == 1000 * 131_072 == cost_tp2.kv_bytes(1000)
    # 10k tokens = 1.3 GB over a 50 GB/s NIC at 80 %: ~33 ms.
    assert cost.migration_time(10_000) == pytest.approx(10_000 * 131_072 / 40e9, rel=0.01)
    assert cost.startup_time() == pytest.approx(20 + LLAMA_31_8B.weight_bytes / 2e9)
    assert CostModel(H100_80G, LLAMA_31_70B, 4).startup_time() > cost.startup_time() > cost_tp2.startup_time()


def test_a100_is_slower_than_h100_in_both_regimes() -> None:
    a100, h100 = CostModel(A100_80G, LLAMA_31_8B), h100_8b()
    for batch in ([BatchItem(1, 100)], [BatchItem(2048)]):
        assert a100.step_cost(batch).seconds > 1.3 * h100.step_cost(batch).seconds


def test_bad_shapes_are_rejected() -> None:
    with pytest.raises(ValueError, match="divide"):
        CostModel(H100_80G, LLAMA_31_8B, 3)
    with pytest.raises(ValueError, match="KV heads"):
        CostModel(H100_80G, QWEN25_7B, 7)  # 7 divides 28 query heads but not 4 KV heads
    with pytest.raises(ValueError, match="new_tokens"):
        h100_8b().step_cost([BatchItem(0, 5)])


def test_lookups_are_case_insensitive_and_list_the_choices() -> None:
    assert get_gpu("h100-80g") is H100_80G and set(GPUS) == {"a100-80g", "h100-80g"}
    assert get_model("meta-llama/Llama-3.1-8B-Instruct") is LLAMA_31_8B
    assert get_model("Qwen/Qwen2.5-7B-Instruct") is QWEN25_7B
    with pytest.raises(ValueError, match="llama-3.1-8b"):
        get_model("gpt-5")
    with pytest.raises(ValueError, match="A100-80G"):
        get_gpu("V100")


@pytest.mark.parametrize("point", POINTS, ids=lambda p: f"{p.gpu}-{p.model}-tp{p.tp}-{p.kind}-{p.input_len}-{p.output_len}")
def test_calibration_point_within_tolerance(point: PublishedPoint) -> None:
    error = relative_error(point)
    if point.caveat:
        assert error > 0, "a caveat explains an over-prediction here; re-check it if the sign flips"
    else:
        assert abs(error) <= TOLERANCE, f"{point.model} {point.kind}: {error:+.1%}"


def test_the_documented_calibration_table_is_current() -> None:
    assert markdown_table() in DOC.read_text(), "regenerate: python -m clairvoyant.worker.costmodel.calibration"
