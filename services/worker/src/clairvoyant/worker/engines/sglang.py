"""SGLang behind the worker contract, through its native HTTP server (``python -m sglang.launch_server``).

What maps to what (SGLang 0.5.23; paths are under ``python/sglang/`` in its repository):

    Generate          POST /generate (``srt/entrypoints/http_server.py``): ``input_ids``, ``stream``,
                      ``sampling_params`` (max_new_tokens, temperature, top_p, stop, ignore_eos,
                      min_new_tokens, frequency_penalty, presence_penalty,
                      repetition_penalty, logit_bias, sampling_seed: unknown keys there are refused with 400,
                      ``api/v1/api_types.py``), ``rid`` = our request id, ``priority``,
                      ``cache_salt`` = the tenant (its radix keys and KV-event hashes are salted),
                      ``session_id`` = the request id (attribution only: its KV events name it,
                      ``srt/managers/io_struct.py``, ``srt/mem_cache/events.py``)
    stream            ``data: {text, output_ids, meta_info}`` lines, then ``data: [DONE]``; text and
                      ids are cumulative (``--incremental-streaming-output`` off, the default:
                      ``srt/managers/tokenizer_manager.py``); meta_info carries prompt_tokens,
                      completion_tokens, cached_tokens and finish_reason {type: stop | length |
                      abort}.  An abort with a 4xx/5xx ``status_code``, or an ``error`` chunk, is a
                      failure (InvalidRequest / Unavailable), not an output.
    stop strings      SGLang streams a stop string's first tokens before it matches and trims only
                      the final text (``srt/managers/detokenizer_manager.py``): text that may begin
                      a stop string is held back here until the next chunk settles it
    tokenize          POST /v1/tokenize: ``prompt`` (with the tokenizer's special tokens), or
                      ``messages`` (and ``tools``) rendered as a chat completion renders them
                      (``srt/entrypoints/openai/serving_tokenize.py``)
    constraints       sampling_params ``json_schema``, ``regex``, ``ebnf`` or ``structural_tag``
                      (``constraint_params``)
    n > 1             refused (``ExternalFrontend.build_request``): one stream is one choice
    priority          ``--enable-priority-scheduling``; SGLang serves HIGHER values first unless
                      ``--schedule-low-priority-values-first`` (``srt/arg_groups/fields/schedule.py``)
    KV events         ``--kv-events-config`` {publisher zmq, endpoint, topic, bind false}: the
                      publisher connects to the worker; vLLM's wire format (``srt/disaggregation/
                      kv_events.py``).  SGLang's page is the event's block: ``--page-size 16``, our
                      block, so every page re-hashes (the default page is 1 token)
    stats             GET /metrics (``--enable-metrics``; ``srt/observability/metrics_collector.py``)
    abort             closing the HTTP stream (the response's background task aborts the rid)
    directives        pre_prefill only (the frontend's 1-token generation); SGLang has no
                      per-request drop, pin, tier promotion or write-back (HiCache moves pages by
                      its own policy, ``--enable-hierarchical-cache``, only when the operator
                      passes it in ``CV_ENGINE_ARGS``)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence

import httpx

from clairvoyant.core.errors import InvalidRequest, Unavailable
from clairvoyant.core.structured import OutputConstraint
from clairvoyant.worker.core.grammar import choice_regex
from clairvoyant.worker.core.sampling import TokenLogprob
from clairvoyant.worker.core.types import EngineStats, RequestOutput
from clairvoyant.worker.engines.adapter import (
    EngineAdapter,
    EngineCall,
    LaunchSpec,
    Metrics,
    integer_priority,
    openai_messages,
    raise_for_engine,
    sse_events,
    stream_output,
)
from clairvoyant.worker.frontend import PromptInput

PAGE_SIZE = 16  # SGLang's KV page, in tokens: our re-hashed block (kv_bridge needs a multiple of 16)


def constraint_params(constraint: OutputConstraint) -> dict[str, str]:
    """A constraint as SGLang's sampling params (``srt/sampling/sampling_params.py``: one of
    ``json_schema``, ``regex``, ``ebnf``, ``structural_tag``).  SGLang has no ``json_object`` or
    ``choice``: they go as the schema ``{"type": "object"}`` and an alternation regex."""
    kind, spec = constraint.kind, constraint.spec
    if kind == "json_schema":
        return {"json_schema": spec}
    if kind == "json_object":
        return {"json_schema": '{"type": "object"}'}
    if kind == "regex":
        return {"regex": spec}
    if kind == "ebnf":
        return {"ebnf": spec}
    if kind == "choice":
        return {"regex": choice_regex(json.loads(spec))}
    return {"structural_tag": spec}


class SglangAdapter(EngineAdapter):
    name = "sglang"
    unsupported_directives = ("drop", "retain", "write_back", "promote")

    def launch_command(self, spec: LaunchSpec) -> list[str]:
        args = [
            spec.python, "-m", "sglang.launch_server",
            "--model-path", spec.model_path, "--served-model-name", spec.served_name,
            "--host", spec.host, "--port", str(spec.port), "--device", spec.device,
            "--max-running-requests", str(spec.max_num_seqs),
            "--enable-priority-scheduling", "--page-size", str(PAGE_SIZE), "--enable-metrics",
        ]  # fmt: skip
        if spec.kv_events_endpoint:
            # A concrete host: SGLang's publisher connects to the socket the worker binds.
            events = {"publisher": "zmq", "endpoint": spec.kv_events_endpoint, "topic": "kv", "bind": False}
            args += ["--kv-events-config", json.dumps(events)]
        if spec.max_model_len:
            args += ["--context-length", str(spec.max_model_len)]
        return args + list(spec.extra_args)

    async def tokenize(self, client: httpx.AsyncClient, model: str, prompt: PromptInput) -> list[int]:
        body: dict[str, object] = {"model": model}
        if prompt.messages is not None:
            body["messages"] = openai_messages(prompt.messages)
            if prompt.tools:
                body["tools"] = list(prompt.tools)
        elif prompt.text is not None:
            body["prompt"] = prompt.text
        else:
            raise InvalidRequest("a prompt is required", param="prompt")
        response = await client.post("/v1/tokenize", json=body)
        await raise_for_engine(response, self.name)
        return [int(t) for t in response.json()["tokens"]]

    def request_body(self, call: EngineCall) -> dict[str, object]:
        sampling = call.sampling
        params: dict[str, object] = {
            "max_new_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "stop": list(sampling.stop),
            "ignore_eos": sampling.ignore_eos,
            "min_new_tokens": sampling.min_tokens,
            "frequency_penalty": sampling.frequency_penalty,
            "presence_penalty": sampling.presence_penalty,
            "repetition_penalty": sampling.repetition_penalty,
        }
        if sampling.logit_bias:  # srt/sampling/sampling_params.py: token id strings -> bias
            params["logit_bias"] = {str(token): bias for token, bias in sampling.logit_bias}
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed  # honoured with --enable-deterministic-inference
        if sampling.constraint is not None:
            params |= constraint_params(sampling.constraint)
        return {
            "rid": call.request_id,
            "input_ids": call.prompt_ids,
            "sampling_params": params,
            "stream": True,
            "priority": integer_priority(call.priority, lower_first=False),
            "cache_salt": call.tenant,
            "session_id": call.request_id,
            **self._logprob_fields(call),
        }

    @staticmethod
    def _logprob_fields(call: EngineCall) -> dict[str, object]:
        """Output tokens' log probabilities with their text (``srt/managers/io_struct.py``:
        ``logprob_start_len`` -1 leaves the prompt's out)."""
        if call.sampling.logprobs is None:
            return {}
        return {
            "return_logprob": True, "top_logprobs_num": call.sampling.logprobs,
            "return_text_in_logprobs": True, "logprob_start_len": -1,
        }  # fmt: skip

    async def generate(
        self, client: httpx.AsyncClient, model: str, call: EngineCall
    ) -> AsyncIterator[RequestOutput]:
        sent_ids, sent_text, sent_logprobs = 0, "", 0  # how much of the cumulative output has been yielded
        async with client.stream("POST", "/generate", json=self.request_body(call)) as response:
            await raise_for_engine(response, self.name)
            async for chunk in sse_events(response):
                error = chunk.get("error")
                if isinstance(error, dict):
                    raise self._failure(error.get("code"), error.get("message"))
                meta = chunk.get("meta_info")
                meta = meta if isinstance(meta, dict) else {}
                finish = meta.get("finish_reason")
                ids = list(chunk.get("output_ids") or ())  # type: ignore[call-overload]
                text = str(chunk.get("text") or "")
                if not isinstance(finish, dict):
                    text = without_stop_prefix(text, call.sampling.stop)
                elif _count(finish.get("status_code")) >= 400:
                    raise self._failure(finish.get("status_code"), finish.get("message"))
                new_text = text[len(sent_text) :] if text.startswith(sent_text) else ""
                new_ids = ids[sent_ids:]
                sent_ids, sent_text = max(sent_ids, len(ids)), sent_text + new_text
                prompt_tokens = _count(meta.get("prompt_tokens"), len(call.prompt_ids))
                completion_tokens = _count(meta.get("completion_tokens"), sent_ids)
                logprobs = sglang_logprobs(meta, sent_logprobs) if call.sampling.logprobs is not None else ()
                sent_logprobs += len(logprobs)
                if isinstance(finish, dict):
                    output = stream_output(
                        call.request_id, new_ids, new_text,
                        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                        cached_tokens=_count(meta.get("cached_tokens")), finish_reason=str(finish.get("type")),
                    )  # fmt: skip
                    output.logprobs = logprobs
                    matched = finish.get("matched")  # a stop string, or the id of a stop token
                    output.stop_sequence = matched if isinstance(matched, str) else None
                    yield output
                    return
                if new_ids or new_text:
                    output = stream_output(
                        call.request_id, new_ids, new_text,
                        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                    )  # fmt: skip
                    output.logprobs = logprobs
                    yield output
                else:
                    sent_logprobs -= len(logprobs)  # nothing yielded: they go with the next output
        raise Unavailable(f"{self.name} ended request {call.request_id} without a finish reason")

    def _failure(self, code: object, message: object) -> InvalidRequest | Unavailable:
        """An ``error`` chunk or an abort with a status code: the code says whose mistake it was."""
        message = str(message or "")[:500]
        if isinstance(code, int) and 400 <= code < 500:
            return InvalidRequest(f"{self.name} refused the request: {message}", param="messages")
        return Unavailable(f"{self.name} failed the request ({code}): {message}")

    def stats(self, metrics: Metrics, max_num_seqs: int) -> EngineStats:
        page = max(1, int(metrics.get("sglang:page_size", PAGE_SIZE)))
        cached = int(metrics.get("sglang:cached_tokens_total"))  # summed over cache_source
        prompt_tokens = int(metrics.get("sglang:prompt_tokens_total"))
        evictable = int(metrics.get("sglang:kv_evictable_tokens"))
        return EngineStats(
            running=queue_gauge(metrics, "sglang:num_running_reqs"),
            waiting=queue_gauge(metrics, "sglang:num_queue_reqs"),
            kv_blocks_used=(int(metrics.get("sglang:kv_used_tokens")) + evictable) // page,
            kv_blocks_total=int(metrics.get("sglang:num_pages")),
            kv_blocks_cached=evictable // page,
            preemptions_total=int(metrics.get("sglang:num_retracted_requests_total")),
            prompt_tokens_total=prompt_tokens,
            computed_prompt_tokens_total=max(0, prompt_tokens - cached),
            cached_prompt_tokens_total=cached,
            generated_tokens_total=int(metrics.get("sglang:generation_tokens_total")),
            max_num_seqs=max_num_seqs,
            l2_blocks_used=int(metrics.get("sglang:hicache_host_used_tokens")) // page,
            l2_blocks_total=int(metrics.get("sglang:hicache_host_total_tokens")) // page,
            hit_tokens=(cached, 0, 0),
        )

    def block_size(self, metrics: Metrics) -> int | None:
        value = int(metrics.get("sglang:page_size"))
        return value or None

    def max_model_len(self, served: Mapping[str, object]) -> int | None:
        value = served.get("max_model_len")  # the model's context_len (its ModelCard)
        return int(value) if isinstance(value, int | float) else None


def _count(value: object, default: int = 0) -> int:
    return int(value) if isinstance(value, int | float) else default


def queue_gauge(metrics: Metrics, name: str) -> int:
    """A request-count gauge.  With priority scheduling SGLang exports the total under
    ``priority=""`` and again split by priority value, so the sum over label sets is twice it."""
    value = metrics.get(name)
    if "priority" in metrics.labels.get(name, {}):
        value /= 2
    return int(value)


def without_stop_prefix(text: str, stop: Sequence[str]) -> str:
    """``text`` less its longest tail that begins one of the ``stop`` strings."""
    held = 0
    for string in stop:
        for length in range(min(len(string) - 1, len(text)), held, -1):
            if text.endswith(string[:length]):
                held = length
                break
    return text[: len(text) - held]


def sglang_logprobs(meta: Mapping[str, object], start: int) -> tuple[TokenLogprob, ...]:
    """The tokens of ``meta_info``'s cumulative ``output_token_logprobs`` (``[logprob, id, text]``)
    from ``start`` on, with their ``output_top_logprobs`` (``tokenizer_manager.add_logprob_to_meta_info``)."""
    tokens = list(meta.get("output_token_logprobs") or [])  # type: ignore[call-overload]
    tops = list(meta.get("output_top_logprobs") or [])  # type: ignore[call-overload]
    out = []
    for index in range(start, len(tokens)):
        value, token_id, text = tokens[index]
        top = [tuple(entry) for entry in (tops[index] if index < len(tops) and tops[index] else [])]
        out.append(
            TokenLogprob(
                int(token_id), float(value), tuple((int(t), float(v)) for v, t, _ in top),
                text=str(text or ""), top_texts=tuple(str(x or "") for _, _, x in top),
            )
        )  # fmt: skip
    return tuple(out)
