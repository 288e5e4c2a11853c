"""An OpenAI request body (``clairvoyant.core.openai_schema``, validated) as a ``GenerationRequest``.

Raises InvalidRequest for what the schema leaves to the gateway: max_tokens or min_tokens past
``max_tokens_limit``, and ``app_metadata`` that ``parse_app_metadata`` refuses.
"""

from __future__ import annotations

from clairvoyant.core.app_metadata import parse_app_metadata
from clairvoyant.core.openai_schema import ChatCompletionBody, CompletionBody, GenerationBody
from clairvoyant.gateway.request import Endpoint, GenerationRequest, Sampling


def sampling(body: GenerationBody, max_tokens_limit: int) -> Sampling:
    max_tokens, min_tokens = body.token_counts(max_tokens_limit)
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
    )


def to_request(
    body: ChatCompletionBody | CompletionBody,
    *,
    tenant: str,
    endpoint: Endpoint,
    request_id: str,
    arrival_time: float,
    max_tokens_limit: int,
) -> GenerationRequest:
    meta = parse_app_metadata(body.app_metadata) if body.app_metadata is not None else None
    return GenerationRequest(
        request_id=request_id,
        tenant=tenant,
        endpoint=endpoint,
        model=body.model,
        sampling=sampling(body, max_tokens_limit),
        arrival_time=arrival_time,
        chat=body.turns() if isinstance(body, ChatCompletionBody) else None,
        prompt=body.prompt if isinstance(body, CompletionBody) else None,
        app_metadata=meta,
        stream=bool(body.stream),
        echo_annotations=bool(body.echo_annotations),
    )
