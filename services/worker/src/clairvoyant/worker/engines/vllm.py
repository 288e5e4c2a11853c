"""vLLM behind the worker contract, through its OpenAI-compatible server (``vllm.entrypoints.openai.api_server``).

What maps to what (vLLM 0.32):

    Generate          POST /v1/completions, ``prompt`` = the token ids, ``stream``,
                      ``return_token_ids`` (each chunk carries its token ids), ``priority``,
                      ``request_id`` (ours, so vLLM's logs and ours agree), ``cache_salt`` =
                      the tenant (no prefix is shared across tenants, as in our own engine),
                      ``session_id`` = the request id (vLLM's KV events name it: the lineage)
    tokenize          POST /tokenize (``messages`` and ``tools`` through the model's chat
                      template, or ``prompt``)
    constraints       ``structured_outputs`` (``StructuredOutputsParams``): ``json`` (the schema),
                      ``json_object``, ``regex``, ``grammar`` (EBNF), ``choice``, ``structural_tag``
    n > 1             refused (``ExternalFrontend.build_request``): one stream is one choice
    priority          ``--scheduling-policy priority``; vLLM serves LOWER values first
    prefix caching    ``--enable-prefix-caching``; cached tokens per request from
                      ``--enable-prompt-tokens-details``
    KV events         ``--kv-events-config`` with a ZMQ publisher that connects to the worker
    stats             GET /metrics: vllm:num_requests_running / _waiting, vllm:kv_cache_usage_perc,
                      vllm:num_preemptions_total, vllm:prefix_cache_hits_total, and the pool size
                      from vllm:cache_config_info's num_gpu_blocks
    abort             closing the HTTP stream (vLLM aborts a request whose client went away)
    directives        pre_prefill only (a 1-token completion at the lowest priority); vLLM has no
                      per-block drop, pin, tier promotion or write-back

On a CPU, vLLM's attention needs a block size that is a multiple of 32, and its default there is
128, so the worker asks for 32; it re-hashes each block as our 16-token blocks (``kv_bridge``).  ``--enforce-eager`` skips
torch.compile on a CPU: the server is up in about 35 s instead of more than 70.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Mapping

import httpx

from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.structured import OutputConstraint
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

CPU_BLOCK_SIZE = 32  # the smallest block vLLM's CPU attention takes


class VllmAdapter(EngineAdapter):
    name = "vllm"
    unsupported_directives = ("drop", "retain", "write_back", "promote")

    def launch_command(self, spec: LaunchSpec) -> list[str]:
        events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": spec.kv_events_endpoint,  # a concrete host: vLLM's publisher connects to us
            "topic": "kv",
        }
        args = [
            spec.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", spec.model_path, "--served-model-name", spec.served_name,
            "--host", spec.host, "--port", str(spec.port),
            "--scheduling-policy", "priority", "--enable-prefix-caching", "--enable-prompt-tokens-details",
            "--max-num-seqs", str(spec.max_num_seqs),
            "--kv-events-config", json.dumps(events),
            "--disable-uvicorn-access-log",
        ]  # fmt: skip
        if spec.max_model_len:
            args += ["--max-model-len", str(spec.max_model_len)]
        if spec.device == "cpu":
            # The CPU default block is 128 tokens: a prefix shorter than that is never cached.
            args += ["--enforce-eager", "--block-size", str(CPU_BLOCK_SIZE)]
        return args + list(spec.extra_args)

    def launch_env(self, spec: LaunchSpec, kv_cache_mb: int) -> Mapping[str, str]:
        if spec.device != "cpu":
            return {}
        # The CPU backend sizes its KV pool from this (GiB); the worker's kv_cache_mb, rounded up.
        return {"VLLM_CPU_KVCACHE_SPACE": str(max(1, math.ceil(kv_cache_mb / 1024)))}

    async def tokenize(self, client: httpx.AsyncClient, model: str, prompt: PromptInput) -> list[int]:
        body: dict[str, object] = {"model": model}
        if prompt.messages is not None:
            body |= {"messages": openai_messages(prompt.messages), "add_generation_prompt": True}
            if prompt.tools:
                body["tools"] = list(prompt.tools)
        elif prompt.text is not None:
            body["prompt"] = prompt.text
        else:
            raise InvalidRequest("a prompt is required", param="prompt")
        response = await client.post("/tokenize", json=body)
        await raise_for_engine(response, self.name)
        return [int(t) for t in response.json()["tokens"]]

    def request_body(self, model: str, call: EngineCall) -> dict[str, object]:
        sampling = call.sampling
        body: dict[str, object] = {
            "model": model,
            "prompt": call.prompt_ids,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "stop": list(sampling.stop),
            "ignore_eos": sampling.ignore_eos,
            "min_tokens": sampling.min_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
            "priority": integer_priority(call.priority, lower_first=True),
            "request_id": call.request_id,
            "session_id": call.request_id,
            "cache_salt": call.tenant,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        body |= {
            "frequency_penalty": sampling.frequency_penalty,
            "presence_penalty": sampling.presence_penalty,
            "repetition_penalty": sampling.repetition_penalty,
        }
        if sampling.logit_bias:
            body["logit_bias"] = {str(token): bias for token, bias in sampling.logit_bias}
        if sampling.logprobs is not None:
            body["logprobs"] = sampling.logprobs
        if sampling.constraint is not None:
            body["structured_outputs"] = structured_outputs(sampling.constraint)
        return body

    async def generate(
        self, client: httpx.AsyncClient, model: str, call: EngineCall
    ) -> AsyncIterator[RequestOutput]:
        body = self.request_body(model, call)
        prompt_tokens, completion_tokens = len(call.prompt_ids), 0
        finish: str | None = None
        stop_sequence: str | None = None  # vLLM's stop_reason: the matched stop string (or a token id)
        async with client.stream("POST", "/v1/completions", json=body) as response:
            await raise_for_engine(response, self.name)
            async for chunk in sse_events(response):
                usage = chunk.get("usage")
                for choice in chunk.get("choices") or ():  # type: ignore[attr-defined]
                    ids = choice.get("token_ids") or []
                    completion_tokens += len(ids)
                    finish = choice.get("finish_reason") or finish
                    if isinstance(choice.get("stop_reason"), str):
                        stop_sequence = choice["stop_reason"]
                    if ids or choice.get("text"):
                        output = stream_output(
                            call.request_id, ids, choice.get("text") or "",
                            prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                        )  # fmt: skip
                        if call.sampling.logprobs is not None:
                            output.logprobs = vllm_logprobs(choice.get("logprobs") or {}, ids, call.sampling.logprobs)
                        yield output
                if isinstance(usage, dict):  # the last chunk (stream_options.include_usage)
                    details = usage.get("prompt_tokens_details") or {}
                    last = stream_output(
                        call.request_id, [], "",
                        prompt_tokens=int(usage.get("prompt_tokens", prompt_tokens)),
                        completion_tokens=int(usage.get("completion_tokens", completion_tokens)),
                        cached_tokens=int(details.get("cached_tokens") or 0),
                        finish_reason=finish or "stop",
                    )  # fmt: skip
                    last.stop_sequence = stop_sequence
                    yield last
                    return
        # A server that sends no usage chunk still ends the request.
        yield stream_output(
            call.request_id, [], "", prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
            finish_reason=finish or "stop",
        )  # fmt: skip

    def stats(self, metrics: Metrics, max_num_seqs: int) -> EngineStats:
        blocks = metrics.labels.get("vllm:cache_config_info", {}).get("num_gpu_blocks", "")
        total = int(blocks) if blocks.isdigit() else 0
        used = round(metrics.get("vllm:kv_cache_usage_perc") * total)
        hits = int(metrics.get("vllm:prefix_cache_hits_total"))
        prompt_tokens = int(metrics.get("vllm:prompt_tokens_total"))
        return EngineStats(
            running=int(metrics.get("vllm:num_requests_running")),
            waiting=int(metrics.get("vllm:num_requests_waiting")),
            kv_blocks_used=used,
            kv_blocks_total=total,
            kv_blocks_cached=0,  # vLLM does not export how many free blocks still hold a prefix
            preemptions_total=int(metrics.get("vllm:num_preemptions_total")),
            prompt_tokens_total=prompt_tokens,
            computed_prompt_tokens_total=max(0, prompt_tokens - hits),
            cached_prompt_tokens_total=hits,
            generated_tokens_total=int(metrics.get("vllm:generation_tokens_total")),
            max_num_seqs=max_num_seqs,
            hit_tokens=(hits, 0, 0),
        )

    def block_size(self, metrics: Metrics) -> int | None:
        value = metrics.labels.get("vllm:cache_config_info", {}).get("block_size", "")
        return int(value) if value.isdigit() else None

    def max_model_len(self, served: Mapping[str, object]) -> int | None:
        value = served.get("max_model_len")
        return int(value) if isinstance(value, int | float) else None


def structured_outputs(constraint: OutputConstraint) -> dict[str, object]:
    """A constraint as vLLM's ``structured_outputs`` (``vllm/sampling_params.py``
    ``StructuredOutputsParams``): exactly one of its fields set."""
    kind, spec = constraint.kind, constraint.spec
    if kind == "json_schema":
        return {"json": json.loads(spec)}
    if kind == "json_object":
        return {"json_object": True}
    if kind == "regex":
        return {"regex": spec}
    if kind == "ebnf":
        return {"grammar": spec}
    if kind == "choice":
        return {"choice": json.loads(spec)}
    return {"structural_tag": spec}


def vllm_logprobs(block: Mapping[str, object], ids: list[int], k: int) -> tuple[TokenLogprob, ...]:
    """A completions chunk's ``logprobs`` (``tokens``, ``token_logprobs``, ``top_logprobs`` as text
    -> logprob) as ours; vLLM names the alternatives by text only, so their ids are 0."""
    tokens = list(block.get("tokens") or [])  # type: ignore[call-overload]
    values = list(block.get("token_logprobs") or [])  # type: ignore[call-overload]
    tops = list(block.get("top_logprobs") or [])  # type: ignore[call-overload]
    out = []
    for index, token_id in enumerate(ids):
        top = sorted((tops[index] or {}).items(), key=lambda item: -item[1])[:k] if index < len(tops) else []
        out.append(
            TokenLogprob(
                token_id, float(values[index]) if index < len(values) else 0.0, tuple((0, float(v)) for _, v in top),
                text=str(tokens[index]) if index < len(tokens) else "", top_texts=tuple(str(t) for t, _ in top),
            )
        )  # fmt: skip
    return tuple(out)
