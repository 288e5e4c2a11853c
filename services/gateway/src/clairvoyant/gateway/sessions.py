"""Sessions without tags: ``app_metadata`` derived from well-known session headers.

Contract of ``derive_app_metadata``: for a request whose body carries no ``app_metadata`` it
returns one when a session header is present, else None (the request stays untagged).  The
body's own ``app_metadata`` always wins, and the tenant is never touched.

- ``workflow_id``: the value of the first header of ``SessionTagging.headers`` present with a
  non-empty value (an empty value counts as absent: templated clients send them).
- ``workflow_type_id``: the ``x-workflow-type-id`` header when present, else
  ``SessionTagging.workflow_type_id``.
- ``agent_id``: ``sys-`` + the first 12 hex digits of the SHA-256 of the first system message
  (``developer`` counts as system), or ``default`` without one.  The first system message names
  the agent: frameworks append later system messages (reminders, retrieved context) that change
  from turn to turn, and a per-turn agent id would teach the profiler nothing.

``derive_conversation_metadata`` tags an untagged Responses API call that belongs to a stored
conversation (a ``previous_response_id`` chain): the session headers still win; without one,
``workflow_id`` is the id of the chain's first response, so every turn of one conversation is one
workflow; the workflow type and agent follow the same rules.  Tagging turned off (no session
headers configured) turns this off too.

A header value that breaks the id rule of ``clairvoyant.core.app_metadata`` is refused with
InvalidRequest naming the header: the client sent it, so dropping it silently would hide its bug.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from clairvoyant.core.app_metadata import ID_PATTERN, ID_RULE, AppMetadata
from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.openai_schema import ChatTurn

DEFAULT_SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "x-session-id")
WORKFLOW_TYPE_HEADER = "x-workflow-type-id"
NO_SYSTEM_PROMPT_AGENT = "default"
AGENT_PREFIX = "sys-"
AGENT_HASH_HEX_DIGITS = 12


class SessionTagging(NamedTuple):
    """How the gateway tags untagged requests (``CV_GATEWAY_SESSION_*``)."""

    headers: tuple[str, ...] = DEFAULT_SESSION_HEADERS  # lower case, in order of precedence; () turns it off
    workflow_type_id: str = "session"


def agent_id_of(chat: Sequence[ChatTurn] | None) -> str:
    """``sys-<12 hex of sha256(first system message)>``; ``default`` with no system message (or no chat)."""
    system = next((turn.content for turn in chat or () if turn.role == "system"), None)
    if system is None:
        return NO_SYSTEM_PROMPT_AGENT
    digest = hashlib.sha256(system.encode("utf-8")).hexdigest()
    return AGENT_PREFIX + digest[:AGENT_HASH_HEX_DIGITS]


def _header_id(headers: Mapping[str, str], name: str) -> str | None:
    """The header's value as an id; None when absent or empty; InvalidRequest when malformed."""
    value = (headers.get(name) or "").strip()
    if not value:
        return None
    if not ID_PATTERN.match(value):
        raise InvalidRequest(
            f"the {name} header must be {ID_RULE} (it tags the request's session)",
            param=name,
            code="invalid_session_header",
        )
    return value


def derive_app_metadata(
    headers: Mapping[str, str], chat: Sequence[ChatTurn] | None, tagging: SessionTagging
) -> AppMetadata | None:
    """The session's ``app_metadata`` for an untagged request, or None when no session header is
    present.  ``headers`` is looked up by lower-case name (Starlette's headers are case-insensitive).
    Raises InvalidRequest for a session or workflow-type header that is not a valid id."""
    workflow_id = next(
        (value for name in tagging.headers if (value := _header_id(headers, name)) is not None), None
    )
    if workflow_id is None:
        return None
    workflow_type_id = _header_id(headers, WORKFLOW_TYPE_HEADER) or tagging.workflow_type_id
    return AppMetadata(workflow_type_id=workflow_type_id, workflow_id=workflow_id, agent_id=agent_id_of(chat))


def derive_conversation_metadata(
    headers: Mapping[str, str],
    chat: Sequence[ChatTurn] | None,
    tagging: SessionTagging,
    conversation_id: str | None,
) -> AppMetadata | None:
    """``derive_app_metadata``, falling back to ``conversation_id`` (the first response id of a
    stored Responses API chain) as the workflow id when no session header names one; None when
    neither does, or when tagging is off.  Raises InvalidRequest as ``derive_app_metadata`` does."""
    derived = derive_app_metadata(headers, chat, tagging)
    if derived is not None or conversation_id is None or not tagging.headers:
        return derived
    workflow_type_id = _header_id(headers, WORKFLOW_TYPE_HEADER) or tagging.workflow_type_id
    return AppMetadata(
        workflow_type_id=workflow_type_id, workflow_id=conversation_id, agent_id=agent_id_of(chat)
    )
