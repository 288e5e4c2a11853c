"""The workflow history: order, byte cap, idle expiry, static prefixes, references, tenants."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from clairvoyant.cachemgr.core.history import WorkflowHistory
from clairvoyant.core.blockhash import BLOCK_TOKENS, chain_hashes
from tests.cachemgr.factories import call

pytestmark = pytest.mark.unit


def tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 32_000, n).tolist()


def call_bytes(prompt: int, output: int) -> int:
    """Bytes one call holds: 4 per token id, 8 per full block of the prompt and the response chain."""
    prompt_blocks = prompt // BLOCK_TOKENS
    return 4 * (prompt + output) + 8 * (prompt_blocks + (prompt + output) // BLOCK_TOKENS - prompt_blocks)


def test_calls_are_kept_in_start_order_with_their_bytes() -> None:
    history = WorkflowHistory()
    history.record(call("r2", tokens(1, 40), tokens(2, 20), agent_id="b", start=5.0), 6.0)
    history.record(call("r1", tokens(3, 100), tokens(4, 30), agent_id="a", start=1.0), 7.0)
    history.record(call("r0", tokens(5, 16), [], workflow_id="", start=0.0), 7.0)  # no workflow: not kept
    calls = history.calls("t", "w1")
    assert [(c.request_id, c.agent_id) for c in calls] == [("r1", "a"), ("r2", "b")]
    assert calls[0].prompt.tolist() == tokens(3, 100)
    assert (len(calls[0].prompt_hashes), len(calls[0].response_hashes)) == (6, 2)
    assert history.nbytes == call_bytes(40, 20) + call_bytes(100, 30)
    assert (len(history), history.workflow_type("t", "w1")) == (1, "type")
    history.check_integrity()


def test_the_byte_cap_evicts_whole_least_recently_active_workflows() -> None:
    one = call_bytes(160, 32)
    history = WorkflowHistory(max_bytes=3 * one)
    history.record(call("a1", tokens(1, 160), tokens(2, 32), workflow_id="A"), 1.0)
    history.record(call("b1", tokens(3, 160), tokens(4, 32), workflow_id="B"), 2.0)
    history.record(call("a2", tokens(5, 160), tokens(6, 32), workflow_id="A", start=2.0), 3.0)  # A is fresher
    assert history.nbytes == 3 * one
    recorded = history.record(call("c1", tokens(7, 160), tokens(8, 32), workflow_id="C"), 4.0)
    assert recorded.evicted == (("t", "B"),)
    recorded = history.record(call("c2", tokens(9, 160), tokens(10, 32), workflow_id="C", start=4.0), 5.0)
    assert recorded.evicted == (("t", "A"),)  # both of A's calls go together
    assert (("t", "A") in history, ("t", "C") in history, history.nbytes) == (False, True, 2 * one)
    # A workflow over the cap on its own goes too, rather than the history exceeding its cap.
    recorded = history.record(call("d1", tokens(11, 16 * 200), [], workflow_id="D"), 6.0)
    assert recorded == (None, (("t", "C"), ("t", "D")))
    assert (len(history), history.nbytes) == (0, 0)
    history.check_integrity()


def test_idle_workflows_expire_and_an_end_drops_one() -> None:
    history = WorkflowHistory(idle_ttl_s=10.0)
    history.record(call("a1", tokens(1, 32), [], workflow_id="A"), 0.0)
    history.record(call("b1", tokens(2, 32), [], workflow_id="B"), 4.0)
    history.record(call("a2", tokens(3, 32), [], workflow_id="A", start=1.0), 6.0)
    assert history.expire(13.9) == []
    assert history.expire(14.0) == [("t", "B")]
    assert history.expire(16.0) == [("t", "A")]
    history.record(call("c1", tokens(4, 32), [], workflow_id="C"), 20.0)
    assert (history.end("t", "C"), history.end("t", "C")) == (True, False)
    assert (len(history), history.nbytes) == (0, 0)


def test_references_count_live_workflows_and_static_prefixes_of_the_tenant_holding_a_block() -> None:
    system = tokens(0, 64)  # 4 blocks every workflow's prompt starts with
    history = WorkflowHistory()
    for i, workflow in enumerate(["A", "B", "C"]):
        history.record(call(f"{workflow}1", system + tokens(i + 1, 32), [], workflow_id=workflow), 1.0)
    history.record(call("X1", system, [], workflow_id="X", tenant="other"), 1.0)
    shared, own = chain_hashes(system)[0], chain_hashes(system + tokens(1, 32))[5]
    # three live workflows, plus the agent's static prefix (its first prompts in two instances agree)
    assert (history.references("t", shared), history.references("t", own)) == (4, 1)
    assert history.references("other", shared) == 1  # one instance: no static prefix yet
    assert history.references("t", shared, all_tenants=True) == 5
    history.end("t", "B")
    assert history.references("t", shared) == 3
    for workflow in ("A", "C"):
        history.end("t", workflow)
    assert (history.references("t", shared), history.references("t", own)) == (
        1,
        0,
    )  # the system prompt outlives them
    history.check_integrity()


def test_static_prefix_is_the_common_block_prefix_of_the_last_two_instances() -> None:
    system = tokens(0, 170)  # 10 full blocks + 10 tokens
    history = WorkflowHistory()
    history.record(call("A1", system + tokens(1, 50), [], workflow_id="A", agent_id="planner"), 1.0)
    assert history.static_prefix("t", "type", "planner") is None  # one instance is not enough
    # A second call of the agent in the same instance is no new sample.
    history.record(call("A2", tokens(2, 300), [], workflow_id="A", agent_id="planner", start=1.0), 2.0)
    assert history.static_prefix("t", "type", "planner") is None
    history.record(call("B1", system + tokens(3, 50), [], workflow_id="B", agent_id="planner"), 3.0)
    assert history.static_prefix("t", "type", "planner") == tuple(system[:160])
    # Two samples of 220 tokens (13 blocks each) and the 160-token prefix, outside the workflows' bytes.
    assert history.static_nbytes == 2 * (4 * 220 + 8 * 13) + 4 * 160
    assert history.static_prefix("u", "type", "planner") is None  # per tenant
    assert history.static_prefix("t", "other-type", "planner") is None  # per workflow type
    # The window is the last two instances: a changed system prompt takes over after two.
    changed = tokens(9, 96)
    history.record(call("C1", changed + tokens(4, 50), [], workflow_id="C", agent_id="planner"), 4.0)
    assert history.static_prefix("t", "type", "planner") is None
    history.record(call("D1", changed + tokens(5, 50), [], workflow_id="D", agent_id="planner"), 5.0)
    assert history.static_prefix("t", "type", "planner") == tuple(changed)
    history.check_integrity()


def test_a_record_without_hashes_gets_them_from_its_tokens() -> None:
    history = WorkflowHistory()
    record = call("r1", tokens(1, 40), tokens(2, 30), with_tokens=True)
    bare = replace(record, prompt_block_hashes=(), response_block_hashes=())
    history.record(bare, 1.0)
    (kept,) = history.calls("t", "w1")
    assert kept.prompt_hashes.tolist() == list(record.prompt_block_hashes)
    assert kept.response_hashes.tolist() == list(record.response_block_hashes)
