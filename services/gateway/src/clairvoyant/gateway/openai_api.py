"""An OpenAI request body (``clairvoyant.core.openai_schema``, validated) as a ``GenerationRequest``.

Raises InvalidRequest for what the schema leaves to the gateway: max_tokens or min_tokens past
``max_tokens_limit``, ``app_metadata`` that ``parse_app_metadata`` refuses, and the rules that
tie tools, the tool choice and output constraints together (``GenerationBody.structure``).

``app_metadata.tool`` (the tool whose result preceded this request) is filled from the messages
when the application tagged the request without it: the function name of the call that the last
message, a ``tool`` result, answers.  A value the application sent always wins.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from clairvoyant.core.app_metadata import ID_PATTERN, AppMetadata, parse_app_metadata
from clairvoyant.core.openai_schema import ChatCompletionBody, ChatTurn, CompletionBody, GenerationBody
from clairvoyant.core.openai_structure import Structure
from clairvoyant.core.structured import tool_of_last_result
from clairvoyant.gateway.request import Endpoint, GenerationRequest, Sampling


def sampling(body: GenerationBody, max_tokens_limit: int, structure: Structure | None = None) -> Sampling:
    max_tokens, min_tokens = body.token_counts(max_tokens_limit)
    structure = structure if structure is not None else body.structure()
    return Sampling(
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop=tuple(body.stop or ()),
        ignore_eos=bool(body.ignore_eos),
        min_tokens=min_tokens,
        frequency_penalty=body.frequency_penalty,
        presence_penalty=body.presence_penalty,
        repetition_penalty=body.repetition_penalty,
        logit_bias=body.logit_biases(),
        logprobs=body.requested_logprobs(),
        constraint=structure.constraint,
        n=body.choices(),
    )


def with_tool_of_last_result(meta: AppMetadata | None, chat: Sequence[ChatTurn] | None) -> AppMetadata | None:
    """``meta`` with ``tool`` filled from the conversation when it has none (see the module's
    docstring); a name that is not a valid id is left out rather than refused."""
    if meta is None or meta.tool is not None or not chat:
        return meta
    tool = tool_of_last_result(chat)
    if tool is None or not ID_PATTERN.match(tool):
        return meta
    return dataclasses.replace(meta, tool=tool)


def to_request(
    body: ChatCompletionBody | CompletionBody,
    *,
    tenant: str,
    endpoint: Endpoint,
    request_id: str,
    arrival_time: float,
    max_tokens_limit: int,
) -> GenerationRequest:
    structure = body.structure()
    chat = body.turns() if isinstance(body, ChatCompletionBody) else None
    meta = parse_app_metadata(body.app_metadata) if body.app_metadata is not None else None
    return GenerationRequest(
        request_id=request_id,
        tenant=tenant,
        endpoint=endpoint,
        model=body.model,
        sampling=sampling(body, max_tokens_limit, structure),
        arrival_time=arrival_time,
        chat=chat,
        prompt=body.prompt if isinstance(body, CompletionBody) else None,
        app_metadata=with_tool_of_last_result(meta, chat),
        stream=bool(body.stream),
        echo_annotations=bool(body.echo_annotations),
        tools=structure.tools,
        tool_choice=structure.tool_choice,
        parallel_tool_calls=structure.parallel_tool_calls,
    )
