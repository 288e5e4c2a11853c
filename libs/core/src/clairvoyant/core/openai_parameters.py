"""Every top-level request parameter of OpenAI's Chat Completions and legacy Completions APIs
(as the ``openai`` package's ``completion_create_params`` types list them), and what this API does
with each.  docs/openai-api.md writes the same table out; a test keeps the two equal.

Contract of ``check_parameters``, per parameter status:

- ``supported``: validated by the body's schema, and it has its effect.
- ``extension``: a field outside OpenAI's reference: this project's own (``app_metadata``,
  ``ignore_eos``, ...) or vLLM's and SGLang's that clients of those servers send (``guided_json``,
  ``structured_outputs``, ``repetition_penalty``, ...).
- ``ignored``: accepted and dropped, because dropping it changes nothing in the answer a client
  gets (the reason sits beside each entry).
- ``refused``: InvalidRequest ``unsupported_parameter`` unless the value asks for nothing: null,
  or one of ``passes`` (``tools: []``, ``logprobs: false``, ...), which SDKs and agent frameworks
  send as defaults.  Answering such a request in plain text would break the client silently.

Any other top-level field is InvalidRequest ``unknown_parameter``, as OpenAI answers an
unrecognised argument, unless the caller is lenient: then it is dropped (refused ones still are
not).  Messages' own fields are the schema's business, not this table's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Literal, NamedTuple, Protocol

from clairvoyant.core.errors import InvalidRequest

Api = Literal["chat", "completions"]
Status = Literal["supported", "extension", "ignored", "refused"]

CHAT: tuple[Api, ...] = ("chat",)
COMPLETIONS: tuple[Api, ...] = ("completions",)
BOTH: tuple[Api, ...] = ("chat", "completions")


class Parameter(NamedTuple):
    name: str
    status: Status
    apis: tuple[Api, ...]
    passes: tuple[object, ...] = ()  # refused only: values (besides null) that ask for nothing

    def asks_for_nothing(self, value: object) -> bool:
        return asks_for_nothing(value, self.passes)


class Refusable(Protocol):
    """A parameter table's entry, as ``check_fields`` reads it (this API's, or another's)."""

    @property
    def status(self) -> Status: ...
    @property
    def passes(self) -> tuple[object, ...]: ...


def asks_for_nothing(value: object, passes: tuple[object, ...]) -> bool:
    """``value`` is null or one of ``passes``, in JSON equality: ``0 == 0.0``, but ``false`` is not ``0``."""
    return value is None or any(
        isinstance(value, bool) == isinstance(neutral, bool) and value == neutral for neutral in passes
    )


PARAMETERS: tuple[Parameter, ...] = (
    Parameter("model", "supported", BOTH),
    Parameter("messages", "supported", CHAT),
    Parameter("prompt", "supported", COMPLETIONS),
    Parameter("max_tokens", "supported", BOTH),
    Parameter("max_completion_tokens", "supported", CHAT),
    Parameter("n", "supported", BOTH),  # 1 to MAX_CHOICES
    Parameter("seed", "supported", BOTH),
    Parameter("stop", "supported", BOTH),
    Parameter("stream", "supported", BOTH),
    Parameter("stream_options", "supported", BOTH),
    Parameter("temperature", "supported", BOTH),
    Parameter("top_p", "supported", BOTH),
    Parameter("frequency_penalty", "supported", BOTH),
    Parameter("presence_penalty", "supported", BOTH),
    Parameter("logit_bias", "supported", BOTH),
    # Chat: a bool.  Completions: a count, where even 0 asks for the chosen tokens' log probabilities.
    Parameter("logprobs", "supported", BOTH),
    Parameter("top_logprobs", "supported", CHAT),
    Parameter("app_metadata", "extension", BOTH),
    Parameter("echo_annotations", "extension", BOTH),
    Parameter("extra_body", "extension", BOTH),  # its fields count as top-level ones
    Parameter("ignore_eos", "extension", BOTH),
    Parameter("min_tokens", "extension", BOTH),
    Parameter("repetition_penalty", "extension", BOTH),
    # vLLM's and SGLang's constrained decoding; at most one constraint per request.
    Parameter("guided_json", "extension", BOTH),
    Parameter("guided_regex", "extension", BOTH),
    Parameter("guided_choice", "extension", BOTH),
    Parameter("guided_grammar", "extension", BOTH),
    Parameter("structural_tag", "extension", BOTH),
    Parameter("structured_outputs", "extension", BOTH),
    Parameter("tools", "supported", CHAT),
    Parameter("tool_choice", "supported", CHAT),
    Parameter("parallel_tool_calls", "supported", CHAT),
    Parameter("response_format", "supported", CHAT),
    # The tenant comes from the API key; OpenAI uses these for abuse detection and cache bucketing.
    Parameter("user", "ignored", BOTH),
    Parameter("safety_identifier", "ignored", CHAT),
    # Caching hints: the cache here keys on the prompt's prefix and the workflow, whatever they say.
    Parameter("prompt_cache_key", "ignored", CHAT),
    Parameter("prompt_cache_options", "ignored", CHAT),
    Parameter("prompt_cache_retention", "ignored", CHAT),
    # OpenAI keeps metadata with a stored completion; nothing is stored here (store is refused).
    Parameter("metadata", "ignored", CHAT),
    # A latency hint (predicted outputs): the answer is the model's own either way.
    Parameter("prediction", "ignored", CHAT),
    # There is one tier; the scheduler's policy orders requests, not the client.
    Parameter("service_tier", "ignored", CHAT),
    # OpenAI deprecated these for tools and tool_choice (as vLLM, this API refuses them).
    Parameter("functions", "refused", CHAT, ([],)),
    Parameter("function_call", "refused", CHAT, ("none", "auto")),
    Parameter("audio", "refused", CHAT),
    Parameter("modalities", "refused", CHAT, (["text"],)),
    Parameter("moderation", "refused", CHAT),
    Parameter("reasoning_effort", "refused", CHAT, ("none",)),
    Parameter("verbosity", "refused", CHAT, ("medium",)),  # OpenAI's default
    Parameter("web_search_options", "refused", CHAT),
    Parameter("store", "refused", CHAT, (False,)),  # stored completions cannot be listed back here
    Parameter("best_of", "refused", COMPLETIONS, (1,)),
    Parameter("echo", "refused", COMPLETIONS, (False,)),
    Parameter("suffix", "refused", COMPLETIONS, ("",)),
)

_BY_API: dict[Api, dict[str, Parameter]] = {
    api: {p.name: p for p in PARAMETERS if api in p.apis} for api in BOTH
}
_QUOTED_NAME_CHARS = 100  # an unknown name may be long; the message quotes its start


def parameters(api: Api) -> Mapping[str, Parameter]:
    """The parameters ``api`` knows, by name."""
    return _BY_API[api]


def check_parameters(body: Mapping[str, object], api: Api, *, lenient: bool = False) -> None:
    """Raise InvalidRequest for the first field of ``body`` that is refused (with a value that asks
    for something) or, unless ``lenient``, unknown to ``api``."""
    check_fields(body, _BY_API[api], lenient=lenient)


def check_fields(body: Mapping[str, object], known: Mapping[str, Refusable], *, lenient: bool) -> None:
    """``check_parameters`` against any parameter table: ``known`` maps a field's name to its entry."""
    for name, value in body.items():
        parameter = known.get(name)
        if parameter is None:
            if not lenient:
                raise InvalidRequest(
                    f"unrecognized request argument supplied: {name[:_QUOTED_NAME_CHARS]!r}",
                    param=name,
                    code="unknown_parameter",
                )
        elif parameter.status == "refused" and not asks_for_nothing(value, parameter.passes):
            accepted = " or ".join(["leave it unset", *(f"send {json.dumps(v)}" for v in parameter.passes)])
            raise InvalidRequest(
                f"unsupported parameter: {name!r} is not supported here; {accepted}",
                param=name,
                code="unsupported_parameter",
            )
