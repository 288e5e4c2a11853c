"""Sessions without tags: app_metadata derived from session headers and the system prompt."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.openai_schema import ChatTurn
from clairvoyant.gateway.config import GatewaySettings
from clairvoyant.gateway.sessions import (
    SessionTagging,
    agent_id_of,
    derive_app_metadata,
    derive_conversation_metadata,
)
from tests.gateway.conftest import Stack, StackFactory
from tests.gateway.fakes import MODEL

TAGGING = SessionTagging()
PLANNER = "You are the planner. Break the task into steps."
CODER = "You are the coder. Write the code for one step."


def chat(system: str | None, user: str = "fix the failing test") -> tuple[ChatTurn, ...]:
    turns = (ChatTurn("user", user),)
    return turns if system is None else (ChatTurn("system", system), *turns)


def derived(headers: dict[str, str], turns: tuple[ChatTurn, ...], tagging: SessionTagging = TAGGING) -> AppMetadata:
    meta = derive_app_metadata(headers, turns, tagging)
    assert meta is not None, f"nothing derived from {headers}"
    return meta


def sys_agent(system: str) -> str:
    return "sys-" + hashlib.sha256(system.encode()).hexdigest()[:12]


# ---- the derivation -----------------------------------------------------------------------------


@pytest.mark.unit
def test_the_first_header_in_order_names_the_workflow() -> None:
    every = {"x-session-id": "c", "session-id": "b", "x-claude-code-session-id": "a"}
    assert derive_app_metadata(every, chat(PLANNER), TAGGING) == AppMetadata(
        workflow_type_id="session", workflow_id="a", agent_id=sys_agent(PLANNER)
    )
    later = {"x-session-id": "c", "session-id": "b"}
    assert derived(later, chat(PLANNER)).workflow_id == "b"
    # The configured order rules, and an empty value counts as absent.
    reordered = SessionTagging(headers=("x-session-id", "session-id"))
    assert derived(every, chat(None), reordered).workflow_id == "c"
    blank = {"x-claude-code-session-id": " ", "x-session-id": "c"}
    assert derived(blank, chat(None)).workflow_id == "c"


@pytest.mark.unit
def test_no_session_header_derives_nothing() -> None:
    assert derive_app_metadata({}, chat(PLANNER), TAGGING) is None
    assert derive_app_metadata({"x-workflow-type-id": "coding", "x-request-id": "r1"}, chat(None), TAGGING) is None
    off = SessionTagging(headers=())
    assert derive_app_metadata({"x-claude-code-session-id": "a"}, chat(PLANNER), off) is None


@pytest.mark.unit
def test_the_workflow_type_comes_from_its_header_or_the_setting() -> None:
    headers = {"session-id": "s-1"}
    custom = SessionTagging(workflow_type_id="claude_code")
    assert derived(headers, chat(None), custom).workflow_type_id == "claude_code"
    typed = {**headers, "x-workflow-type-id": "swe_agent"}
    assert derived(typed, chat(None), custom).workflow_type_id == "swe_agent"


@pytest.mark.unit
def test_the_agent_is_the_hash_of_the_first_system_prompt() -> None:
    planner = agent_id_of(chat(PLANNER))
    assert planner == sys_agent(PLANNER) and len(planner) == len("sys-") + 12
    assert agent_id_of(chat(PLANNER, user="another turn")) == planner  # stable across turns
    assert agent_id_of(chat(CODER)) != planner  # distinct agents in one session are told apart
    # A later system message (a reminder, retrieved context) does not change the agent.
    reminded = (*chat(PLANNER), ChatTurn("system", "reminder: 3 steps left"))
    assert agent_id_of(reminded) == planner
    assert agent_id_of(chat(None)) == "default" and agent_id_of(None) == "default"
    assert agent_id_of(chat("")) == sys_agent("")  # an empty system prompt is still a system prompt


@pytest.mark.unit
@pytest.mark.parametrize(
    ("header", "value"),
    [("x-claude-code-session-id", "has spaces"), ("session-id", "x" * 129), ("x-workflow-type-id", "bad\u00e9")],
)
def test_an_invalid_header_value_is_refused_naming_the_header(header: str, value: str) -> None:
    headers = {"session-id": "ok", header: value}
    with pytest.raises(InvalidRequest) as refused:
        derive_app_metadata(headers, chat(None), TAGGING)
    assert (refused.value.param, refused.value.code) == (header, "invalid_session_header")
    assert refused.value.message.startswith(f"the {header} header must be 1 to 128 characters")


@pytest.mark.unit
def test_settings_give_the_tagging() -> None:
    def settings(**values: str) -> GatewaySettings:
        return GatewaySettings.model_validate(values)

    assert settings().session_tagging() == TAGGING == SessionTagging(
        ("x-claude-code-session-id", "session-id", "x-session-id"), "session"
    )
    custom = settings(gateway_session_headers=" X-Trace-Session , ,session-id", gateway_session_workflow_type="cc")
    assert custom.session_tagging() == SessionTagging(("x-trace-session", "session-id"), "cc")
    assert settings(gateway_session_headers="").session_tagging().headers == ()
    with pytest.raises(ValueError, match="gateway_session_workflow_type"):
        settings(gateway_session_workflow_type="has space")


@pytest.mark.unit
def test_a_stored_conversation_names_the_workflow_when_no_header_does() -> None:
    chain = "resp_0123456789abcdef0123456789abcdef"
    assert derive_conversation_metadata({}, chat(PLANNER), TAGGING, chain) == AppMetadata(
        workflow_type_id="session", workflow_id=chain, agent_id=sys_agent(PLANNER)
    )
    typed = derive_conversation_metadata({"x-workflow-type-id": "coding"}, chat(None), TAGGING, chain)
    assert typed == AppMetadata(workflow_type_id="coding", workflow_id=chain, agent_id="default")
    # A session header wins over the conversation; no conversation and no header: untagged.
    header = derive_conversation_metadata({"session-id": "s-1"}, chat(None), TAGGING, chain)
    assert header is not None and header.workflow_id == "s-1"
    assert derive_conversation_metadata({}, chat(PLANNER), TAGGING, None) is None
    # Tagging off turns this off too.
    assert derive_conversation_metadata({}, chat(PLANNER), SessionTagging(headers=()), chain) is None
    with pytest.raises(InvalidRequest) as caught:
        derive_conversation_metadata({"x-workflow-type-id": "bad type"}, chat(None), TAGGING, chain)
    assert caught.value.param == "x-workflow-type-id"


# ---- through the HTTP edge ----------------------------------------------------------------------

TAGGED = {"workflow_type_id": "coding_assistant", "workflow_id": "tagged-1", "agent_id": "engineer"}


@pytest.mark.integration
async def test_a_session_header_tags_the_request_for_scheduler_and_record(stack: Stack) -> None:
    messages = [{"role": "system", "content": PLANNER}, {"role": "user", "content": "plan the fix"}]
    headers = {"X-Claude-Code-Session-Id": "0b6f-session", "session-id": "loses"}
    async with httpx.AsyncClient(base_url=stack.url) as http:
        r = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages}, headers=headers)
        assert r.status_code == 200, r.text
        record = await stack.records.next()
        meta = record.app_metadata
        assert (meta.workflow_type_id, meta.workflow_id, meta.agent_id) == (
            "session",
            "0b6f-session",
            sys_agent(PLANNER),
        )
        assert record.tenant == "default"
        [scheduled] = stack.scheduler.schedule_calls
        assert (scheduled.app_metadata.workflow_id, scheduled.app_metadata.agent_id) == (
            "0b6f-session",
            sys_agent(PLANNER),
        )

        # Explicit app_metadata wins over the headers.
        tagged = {"model": MODEL, "messages": messages, "app_metadata": TAGGED}
        r = await http.post("/v1/chat/completions", json=tagged, headers=headers)
        assert r.status_code == 200, r.text
        meta = (await stack.records.next()).app_metadata
        assert (meta.workflow_id, meta.agent_id) == ("tagged-1", "engineer")

        # No session header: untagged, as before.
        r = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages})
        assert r.status_code == 200, r.text
        assert not (await stack.records.next()).HasField("app_metadata")


@pytest.mark.integration
async def test_an_invalid_session_header_is_a_400_before_scheduling(stack: Stack) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(base_url=stack.url) as http:
        r = await http.post("/v1/chat/completions", json=body, headers={"x-session-id": "not an id"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (
        "x-session-id",
        "invalid_session_header",
        "invalid_request_error",
    )
    assert stack.scheduler.schedule_calls == []
    await stack.records.assert_none()


@pytest.mark.integration
async def test_session_tagging_can_be_turned_off(make_stack: StackFactory) -> None:
    stack = await make_stack(gateway_session_headers="")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(base_url=stack.url) as http:
        r = await http.post("/v1/completions", json={"model": MODEL, "prompt": "hi"}, headers={"session-id": "s"})
        assert r.status_code == 200, r.text
        r = await http.post("/v1/chat/completions", json=body, headers={"x-session-id": "not an id"})
        assert r.status_code == 200, r.text
    assert not (await stack.records.next()).HasField("app_metadata")
    assert not (await stack.records.next()).HasField("app_metadata")
