"""Request lifecycle: validation, abort, stop conditions and sampling."""

from __future__ import annotations

import pytest
import torch

from clairvoyant.core.errors import ContextLengthExceeded
from clairvoyant.worker.core.engine import SamplingParams
from clairvoyant.worker.core.sampling import SampleRow, adjust_logits, token_logprobs
from tests.worker.fakes import EOS, Collected, FakeRunner, collect, drain, letters, make_engine, request

pytestmark = pytest.mark.unit


def _run_alone(
    rid: str = "r", prompt: list[int] | None = None, runner: FakeRunner | None = None, **kw: object
) -> Collected:
    engine, _ = make_engine(runner=runner, block_size=4, num_blocks=128)
    engine.add_request(request(rid, prompt if prompt is not None else letters(12, seed=4), **kw))  # type: ignore[arg-type]
    return drain(engine)[rid]


# ---- validation ---------------------------------------------------------------------------------
def test_add_request_rejects_bad_requests() -> None:
    engine, _ = make_engine(runner=FakeRunner(max_model_len=64), block_size=4, num_blocks=8)
    with pytest.raises(ContextLengthExceeded) as info:
        engine.add_request(request("long", letters(60, 1), max_tokens=8))
    assert "maximum context length is 64 tokens" in info.value.message
    assert "68 tokens (60 in the prompt, 8 for the completion)" in info.value.message
    with pytest.raises(ValueError, match="at least one token"):
        engine.add_request(request("empty", [], max_tokens=8))
    with pytest.raises(ValueError, match="KV blocks"):  # 30 + 4 - 1 tokens need 9 blocks > 8
        engine.add_request(request("huge", letters(30, 1), max_tokens=4))
    engine.add_request(request("ok", letters(29, 1), max_tokens=4))  # 32 tokens: exactly 8 blocks
    with pytest.raises(ValueError, match="duplicate"):
        engine.add_request(request("ok", letters(3, 1), max_tokens=4))
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError):
        SamplingParams(max_tokens=2, min_tokens=3)
    assert engine.stats().waiting == 1
    assert drain(engine)["ok"].final.completion_tokens == 4


# ---- abort --------------------------------------------------------------------------------------
def test_abort_frees_blocks_and_reports_abort() -> None:
    engine, _ = make_engine(block_size=4, num_blocks=64)
    results: dict[str, Collected] = {}
    engine.add_request(request("a", letters(10, 1), max_tokens=30))
    engine.add_request(request("b", letters(10, 2), max_tokens=30))
    for _ in range(5):
        collect(engine.step(), results)
    used_before = engine.stats().kv_blocks_used
    assert engine.abort_request("a") is True
    assert engine.abort_request("a") is False
    assert engine.abort_request("nope") is False
    engine.check_integrity()
    assert engine.stats().kv_blocks_used < used_before
    outputs = engine.step()
    collect(outputs, results)
    final_a = results["a"].final
    assert (final_a.finish_reason, final_a.new_token_ids, final_a.completion_tokens) == ("abort", [], 5)
    assert [o.request_id for o in outputs] == ["a", "b"]

    engine.abort_request("b")
    engine.add_request(request("queued", letters(10, 3), max_tokens=4))
    assert engine.abort_request("queued") is True  # never scheduled
    collect(engine.step(), results)
    assert not engine.has_unfinished()
    assert results["queued"].final.finish_reason == "abort" and results["queued"].token_ids == []
    stats = engine.stats()
    assert stats.running == stats.waiting == 0
    # 15 computed tokens per request -> 3 full blocks each stay cached; nothing else is held.
    assert stats.kv_blocks_used == stats.kv_blocks_cached == 6
    engine.check_integrity()


# ---- stop conditions ----------------------------------------------------------------------------
def test_max_tokens_finishes_with_length() -> None:
    r = _run_alone(max_tokens=7)
    assert (len(r.token_ids), r.final.finish_reason, len(r.text)) == (7, "length", 7)


def test_stop_string_cuts_text_before_it() -> None:
    reference = _run_alone(max_tokens=40)
    stop = reference.text[10:13]
    cut = reference.text.find(stop)
    r = _run_alone(max_tokens=40, stop=("never!", stop))
    assert (r.final.finish_reason, r.final.stop_sequence) == ("stop", stop)  # which one matched
    assert r.text == reference.text[:cut]
    assert len(r.token_ids) == cut + len(stop)  # one byte per token: generation ends on the stop
    assert r.token_ids == reference.token_ids[: cut + len(stop)]


def test_partial_stop_string_is_held_back_then_released() -> None:
    reference = _run_alone(max_tokens=30)
    stop = reference.text[20:24] + "!"  # never completes ("!" is not in the fake alphabet)
    r = _run_alone(max_tokens=30, stop=(stop,))
    assert (r.text, r.final.finish_reason, r.final.stop_sequence) == (reference.text, "length", None)
    released = [len(o.new_text) for o in r.outputs]  # one output per token
    assert released[21:24] == [0, 0, 0]  # tokens 22..24 extend a possible stop start: all held
    assert sum(released[:24]) <= 20  # text[20:24] is released only once "!" fails to follow
    assert sum(released) == 30


def test_min_tokens_suppresses_stop_string_early() -> None:
    reference = _run_alone(max_tokens=40)
    stop = reference.text[2:4]
    min_tokens = 12
    r = _run_alone(max_tokens=40, stop=(stop,), min_tokens=min_tokens)
    # The first occurrence that ends at or after token min_tokens stops the request.
    ends = [
        i for i in range(len(reference.text)) if reference.text.startswith(stop, i) and i + 2 >= min_tokens
    ]
    if ends:
        assert (r.text, r.final.finish_reason) == (reference.text[: ends[0]], "stop")
    else:
        assert (r.text, r.final.finish_reason) == (reference.text, "length")
    assert len(r.text) >= min_tokens - len(stop)


def test_eos_stops_unless_ignored_and_min_tokens_delays_it() -> None:
    eager = FakeRunner(eos_bias=100.0)  # EOS is always the most likely token
    r = _run_alone(runner=eager, max_tokens=10)
    assert (r.token_ids, r.text, r.final.finish_reason) == ([EOS], "", "stop")

    r = _run_alone(runner=FakeRunner(eos_bias=100.0), max_tokens=10, min_tokens=3)
    assert r.token_ids[-1] == EOS and len(r.token_ids) == 4 and EOS not in r.token_ids[:3]
    assert (len(r.text), r.final.finish_reason) == (3, "stop")

    r = _run_alone(runner=FakeRunner(eos_bias=100.0), max_tokens=5, ignore_eos=True)
    assert (r.token_ids, r.text, r.final.finish_reason) == ([EOS] * 5, "", "length")


# ---- sampling -----------------------------------------------------------------------------------
def test_seeded_sampling_is_reproducible_and_seed_sensitive() -> None:
    first = _run_alone(max_tokens=20, temperature=1.0, seed=1234)
    second = _run_alone(max_tokens=20, temperature=1.0, seed=1234)
    other = _run_alone(max_tokens=20, temperature=1.0, seed=4321)
    assert first.token_ids == second.token_ids
    assert first.token_ids != other.token_ids
    # The same seed in a busy batch, next to other requests, samples the same tokens.
    engine, _ = make_engine(block_size=4, num_blocks=128, max_num_batched_tokens=8)
    for i in range(4):
        engine.add_request(request(f"n{i}", letters(9, seed=i), max_tokens=20, temperature=1.0))
    engine.add_request(request("r", letters(12, seed=4), max_tokens=20, temperature=1.0, seed=1234))
    assert drain(engine)["r"].token_ids == first.token_ids


def test_unseeded_sampling_is_deterministic_per_engine_seed() -> None:
    a = _run_alone(max_tokens=20, temperature=1.0)
    b = _run_alone(max_tokens=20, temperature=1.0)
    assert a.token_ids == b.token_ids
    greedy = _run_alone(max_tokens=20)
    assert a.token_ids != greedy.token_ids


def test_tiny_top_p_equals_greedy() -> None:
    greedy = _run_alone(max_tokens=25)
    nucleus = _run_alone(max_tokens=25, temperature=1.3, top_p=1e-6, seed=5)
    assert nucleus.token_ids == greedy.token_ids
    full = _run_alone(max_tokens=25, temperature=1.3, top_p=1.0, seed=5)
    assert full.token_ids != greedy.token_ids


def test_a_token_only_request_generates_the_same_tokens_without_text() -> None:
    prompt = letters(12, seed=4)
    with_text = _run_alone("r", prompt, max_tokens=10, ignore_eos=True)
    token_only = _run_alone("r", prompt, max_tokens=10, ignore_eos=True, detokenize=False)
    assert token_only.token_ids == with_text.token_ids and len(token_only.token_ids) == 10
    assert with_text.text and token_only.text == ""
    assert token_only.final.finish_reason == "length"
    engine, _ = make_engine(block_size=4, num_blocks=16)
    with pytest.raises(ValueError, match="stop strings need text"):
        engine.add_request(request("s", prompt, stop=["a"], detokenize=False))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request(request("v", [1, 2, 10**6]))
    with pytest.raises(ValueError, match="token id -2 outside the vocabulary"):
        engine.add_request(request("n", [1, -2, 3]))
    with pytest.raises(ValueError, match="token id 400 outside the vocabulary"):  # 256 is in (size 257)
        engine.add_request(request("w", [1, 256, 400]))
    assert engine.stats().waiting == 0


# ---- penalties and logit bias ---------------------------------------------------------------------
def row(params: SamplingParams, prompt: tuple[int, ...] = (), output: tuple[int, ...] = ()) -> SampleRow:
    return SampleRow(params, None, (), prompt, output)


def test_penalties_and_bias_adjust_the_logits_as_documented() -> None:
    logits = torch.tensor([2.0, -2.0, 1.0, 0.5, 0.0])
    repeated = adjust_logits(logits, row(SamplingParams(repetition_penalty=2.0), prompt=(0, 1), output=(3,)))
    assert repeated.tolist() == [1.0, -4.0, 1.0, 0.25, 0.0]  # positive / 2, negative x 2, unseen unchanged
    counted = adjust_logits(
        logits,
        row(SamplingParams(frequency_penalty=0.5, presence_penalty=0.25), prompt=(2,), output=(0, 0, 3)),
    )
    assert counted.tolist() == [
        2.0 - 1.0 - 0.25,
        -2.0,
        1.0,
        0.5 - 0.5 - 0.25,
        0.0,
    ]  # the prompt's 2: untouched
    biased = adjust_logits(logits, row(SamplingParams(logit_bias=((1, 100.0), (0, -100.0)))))
    assert biased.tolist() == [-98.0, 98.0, 1.0, 0.5, 0.0]
    both = adjust_logits(
        logits, row(SamplingParams(repetition_penalty=2.0, logit_bias=((0, 1.0),)), prompt=(0,))
    )
    assert both[0].item() == 2.0  # penalised first (2 / 2), then biased (+1)
    assert logits.tolist() == [2.0, -2.0, 1.0, 0.5, 0.0]  # the batch's logits are left alone


def test_bad_penalties_are_refused_at_construction() -> None:
    for kwargs in ({"frequency_penalty": 2.5}, {"presence_penalty": -3}, {"repetition_penalty": 0},
                   {"logit_bias": ((5, 101.0),)}, {"logit_bias": ((-1, 1.0),)}):  # fmt: skip
        with pytest.raises(ValueError):
            SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_a_logit_bias_of_100_forces_a_token_greedy_or_sampled() -> None:
    forced = ord("q")
    for temperature in (0.0, 1.0):
        r = _run_alone(max_tokens=6, temperature=temperature, seed=3, logit_bias=((forced, 100.0),))
        assert r.token_ids == [forced] * 6
    banned = _run_alone(max_tokens=20)
    first = banned.token_ids[0]
    avoided = _run_alone(max_tokens=20, logit_bias=((first, -100.0),))
    assert first not in avoided.token_ids


def test_a_frequency_penalty_breaks_a_greedy_loop() -> None:
    """The fake model's greedy output repeats letters; a strong frequency penalty spreads them."""
    plain = _run_alone(max_tokens=40)
    penalised = _run_alone(max_tokens=40, frequency_penalty=2.0, presence_penalty=2.0)
    assert len(set(penalised.token_ids)) > len(set(plain.token_ids))
    assert max(penalised.token_ids.count(t) for t in penalised.token_ids) < max(
        plain.token_ids.count(t) for t in plain.token_ids
    )


# ---- log probabilities ----------------------------------------------------------------------------
def test_logprobs_name_each_token_and_its_top_alternatives() -> None:
    greedy = _run_alone(max_tokens=8, logprobs=3)
    entries = [lp for out in greedy.outputs for lp in out.logprobs]
    assert [lp.token_id for lp in entries] == greedy.token_ids
    for lp in entries:
        assert len(lp.top) == 3 and lp.top[0][0] == lp.token_id  # greedy picks the most likely
        assert lp.logprob == lp.top[0][1] <= 0
        assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)
    # The model's own distribution: temperature and penalties change the pick, not the numbers.
    hot = _run_alone(max_tokens=8, logprobs=0, temperature=1.5, seed=9, frequency_penalty=2.0)
    assert all(lp.top == () and lp.logprob <= 0 for out in hot.outputs for lp in out.logprobs)
    assert len([lp for out in hot.outputs for lp in out.logprobs]) == len(hot.token_ids)
    assert all(not out.logprobs for out in _run_alone(max_tokens=4).outputs)  # none unless asked


def test_logprobs_are_log_softmax_of_the_logits() -> None:
    logits = torch.tensor([1.0, 3.0, 0.0, 3.0])
    lp = token_logprobs(logits, 2, 2)
    expected = torch.log_softmax(logits, dim=-1)
    assert lp.logprob == pytest.approx(expected[2].item())
    assert [t for t, _ in lp.top] == [1, 3]  # a tie: the lower id first, as argmax
    assert lp.top[0][1] == pytest.approx(expected[1].item())
