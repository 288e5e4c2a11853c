"""Pure pieces of the gateway: body validation, the model catalog, records, settings."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from clairvoyant.contracts.v1 import common_pb2, scheduler_pb2
from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.core.errors import InvalidRequest, ModelNotFound, NoWorkers, QueueFull
from clairvoyant.core.json_input import format_param
from clairvoyant.core.openai_schema import ChatCompletionBody, CompletionBody, validate_body
from clairvoyant.gateway.clients import skip_reason
from clairvoyant.gateway.config import GatewaySettings
from clairvoyant.gateway.http_api import error_response
from clairvoyant.gateway.metrics import UNANNOTATED_REASONS
from clairvoyant.gateway.models import ModelCatalog
from clairvoyant.gateway.openai_api import to_request
from clairvoyant.gateway.records import STATUS_OK, Outcome, build_record
from clairvoyant.gateway.request import Sampling, TokenUsage

pytestmark = pytest.mark.unit

MSG = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> ChatCompletionBody:
    return validate_body({"model": "m", "messages": MSG, **fields}, ChatCompletionBody)


def test_format_param() -> None:
    assert format_param(("messages", 0, "content")) == "messages[0].content"
    assert format_param(("stream_options", "include_usage")) == "stream_options.include_usage"
    assert format_param(()) == "body"


def test_defaults_and_conversion() -> None:
    body = chat(
        messages=[
            {"role": "developer", "content": "rules"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                "name": "u",
            },
            {"role": "assistant", "content": None},
        ],
        stop="END",
        max_tokens=10,
        max_completion_tokens=20,
        user="ignored",
        logprobs=False,
    )
    req = to_request(
        body, tenant="t", endpoint="chat.completions", request_id="r", arrival_time=1.0, max_tokens_limit=100
    )
    assert [(t.role, t.content, t.name) for t in req.chat or ()] == [
        ("system", "rules", None),
        ("user", "ab", "u"),
        ("assistant", "", None),
    ]
    assert req.sampling == Sampling(max_tokens=20, stop=("END",))  # max_completion_tokens wins
    assert (req.stream, req.echo_annotations, req.app_metadata) == (False, False, None)
    plain = to_request(
        chat(), tenant="t", endpoint="grpc", request_id="r", arrival_time=1.0, max_tokens_limit=100
    )
    assert plain.sampling.max_tokens is None  # the pipeline picks the default for the model


def test_sampling_to_proto_leaves_unset_fields_unset() -> None:
    msg = Sampling(max_tokens=5, temperature=0.0).to_proto()
    assert msg.HasField("max_tokens") and msg.HasField("temperature") and msg.temperature == 0.0
    assert not msg.HasField("top_p") and not msg.HasField("seed")
    assert not Sampling().to_proto().HasField("max_tokens")


def test_extra_body_nesting_and_precedence() -> None:
    meta = {"workflow_type_id": "wf", "workflow_id": "w", "agent_id": "a"}
    nested = chat(extra_body={"app_metadata": meta, "temperature": 1.5})
    assert nested.app_metadata == meta and nested.temperature == 1.5
    assert chat(temperature=0.2, extra_body={"temperature": 1.5}).temperature == 0.2
    with pytest.raises(InvalidRequest) as caught:
        chat(extra_body="x")
    assert caught.value.param == "extra_body"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"seed": 1.5}, "seed"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"content": "x"}]}, "messages[0].role"),
        ({"temperature": float("nan")}, "temperature"),
    ],
)
def test_refusals_name_the_parameter(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        body = chat(**fields)
        to_request(
            body, tenant="t", endpoint="chat.completions", request_id="r", arrival_time=0, max_tokens_limit=9
        )
    assert caught.value.param == param and caught.value.http_status == 400


def test_only_assistant_content_may_be_null() -> None:
    # Null content is what an assistant message with tool calls carries; it becomes "".
    body = chat(messages=[*MSG, {"role": "assistant", "content": None}])
    assert body.turns()[1].content == ""
    with pytest.raises(InvalidRequest) as caught:
        chat(messages=[{"role": "user", "content": None}]).turns()
    assert caught.value.param == "messages[0].content"


def test_completion_prompt_forms() -> None:
    assert validate_body({"model": "m", "prompt": ["x"]}, CompletionBody).prompt == "x"
    for bad in ([], ["a", "b"], [1], 3):
        with pytest.raises(InvalidRequest):
            validate_body({"model": "m", "prompt": bad}, CompletionBody)


class Snapshots:
    def __init__(self, *workers: scheduler_pb2.WorkerState) -> None:
        self.workers = list(workers)
        self.calls = 0

    async def snapshot(self, timeout_s: float = 2.0) -> scheduler_pb2.SchedulerSnapshot:
        self.calls += 1
        return scheduler_pb2.SchedulerSnapshot(workers=self.workers)


async def test_model_catalog_caches_and_resolves() -> None:
    source = Snapshots(
        scheduler_pb2.WorkerState(worker_id="a", model="m1", max_model_len=4096),
        scheduler_pb2.WorkerState(worker_id="b", model="m1", max_model_len=2048),
        scheduler_pb2.WorkerState(worker_id="c", model="m2"),
    )
    clock = [0.0]
    catalog = ModelCatalog(source, ttl_s=1.0, now=lambda: clock[0])
    info = await catalog.resolve("m1")
    assert (info.max_model_len, info.workers) == (2048, 2)  # the smallest window is the safe one
    assert (await catalog.resolve("m2")).max_model_len == 0
    assert source.calls == 1
    with pytest.raises(ModelNotFound):
        await catalog.resolve("m3")
    source.workers.clear()
    clock[0] = 0.9
    await catalog.resolve("m1")  # still cached
    clock[0] = 1.0
    with pytest.raises(NoWorkers):
        await catalog.resolve("m1")
    assert source.calls == 2


def test_build_record() -> None:
    body = chat(
        app_metadata={
            "workflow_type_id": "wf",
            "workflow_id": "w",
            "agent_id": "a",
            "parent_request_ids": ["p1"],
        }
    )
    req = to_request(
        body,
        tenant="acme",
        endpoint="chat.completions",
        request_id="r1",
        arrival_time=10.0,
        max_tokens_limit=9,
    )
    assert req.app_metadata == AppMetadata("wf", "w", "a", parent_request_ids=("p1",))
    outcome = Outcome(
        STATUS_OK,
        "w-1",
        TokenUsage(5, 3, 2),
        10.5,
        10.7,
        11.0,
        "stop",
        prompt_block_hashes=(2**64 - 1, 7),
        response_block_hashes=(9,),
    )
    record = build_record(req, outcome)
    assert (list(record.prompt_block_hashes), list(record.response_block_hashes)) == ([2**64 - 1, 7], [9])
    assert (record.request_id, record.tenant, record.worker_id, record.model) == ("r1", "acme", "w-1", "m")
    assert (record.prompt_tokens, record.output_tokens, record.cached_tokens) == (5, 3, 2)
    assert list(record.app_metadata.parent_request_ids) == ["p1"]
    assert (record.timing.arrival_time, record.timing.end_time) == (10.0, 11.0)
    assert record.status == common_pb2.REQUEST_STATUS_OK and record.endpoint == "chat.completions"


def test_error_response_headers() -> None:
    assert error_response(QueueFull("full", retry_after_s=0.2)).headers["retry-after"] == "1"
    assert error_response(QueueFull("full")).headers["retry-after"] == "1"
    assert error_response(QueueFull("full", retry_after_s=7.1)).headers["retry-after"] == "8"
    assert "retry-after" not in error_response(InvalidRequest("bad")).headers


def test_settings(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CV_GATEWAY_PORT", "8123")
    monkeypatch.delenv("CV_DATABASE_URL", raising=False)
    settings = GatewaySettings()
    assert (settings.gateway_port, settings.gateway_grpc_port, settings.max_tokens_limit) == (
        8123,
        50050,
        32768,
    )
    assert str(settings.sqlite_path()) == "var/gateway.db"
    assert settings.profiler_timeout_s == 0.005  # the 5 ms Annotate budget
    assert GatewaySettings(database_url="postgresql+psycopg://u@h/db").sqlite_path() is None
    with pytest.raises(ValueError):
        GatewaySettings(default_max_tokens=10, max_tokens_limit=5)


@pytest.mark.parametrize(
    ("code", "was_connected", "reason"),
    [
        (grpc.StatusCode.DEADLINE_EXCEEDED, True, "timeout"),
        (grpc.StatusCode.DEADLINE_EXCEEDED, False, "unavailable"),  # the deadline went on connecting
        (grpc.StatusCode.UNAVAILABLE, True, "unavailable"),
        (grpc.StatusCode.UNAVAILABLE, False, "unavailable"),
        (grpc.StatusCode.INTERNAL, True, "error"),
        (grpc.StatusCode.UNIMPLEMENTED, True, "error"),
        (grpc.StatusCode.INVALID_ARGUMENT, False, "error"),
    ],
)
def test_skip_reason(code: grpc.StatusCode, was_connected: bool, reason: str) -> None:
    assert skip_reason(code, was_connected) == reason
    assert reason in UNANNOTATED_REASONS
