"""Worker settings (environment prefix ``CV_``)."""

from __future__ import annotations

import socket
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from clairvoyant.core.config import ServiceSettings
from clairvoyant.core.logs import mask_url
from clairvoyant.worker.l3 import L3_BACKENDS

DEFAULT_MODEL = "smollm2-135m-instruct"


class WorkerSettings(ServiceSettings):
    worker_id: str = Field("", description="unique id on the bus; default <hostname>-<grpc port>")
    worker_grpc_port: int = Field(50061, ge=0, le=65535)
    worker_http_port: int = Field(8101, ge=0, le=65535, description="OpenAI-compatible HTTP; 0 disables")
    model: str = Field(DEFAULT_MODEL, description="tiny-random | smollm2-135m-instruct | a .gguf file | an HF dir; emulated: llama-3.1-8b, ...")
    runner: str = Field("torch", description="model runner: torch | emulated")
    gpu: str = Field("H100-80G", description="emulated runner: the GPU whose speed and memory it emulates")
    tensor_parallel: int = Field(1, ge=1, description="emulated runner: GPUs per replica")
    device: str = "cpu"
    max_model_len: int | None = Field(None, gt=0, description="cap the model's context window")
    block_size: int = Field(16, gt=0)
    num_blocks: int = Field(0, ge=0, description="KV blocks; 0 sizes the pool from kv_cache_mb")
    kv_cache_mb: int = Field(256, gt=0)
    max_num_seqs: int = Field(16, gt=0, description="max running sequences (batch size)")
    max_num_batched_tokens: int = Field(1024, gt=0, description="token budget per engine step")
    enable_prefix_cache: bool = True
    aging_rate: float = Field(0.0, ge=0)
    heartbeat_interval_s: float = Field(1.0, gt=0)
    torch_threads: int = Field(0, ge=0, description="torch intra-op threads; 0 keeps torch's default")
    # KV tiers below the device pool (core/tiers.py): L2 in host memory, L3 in shared storage
    host_cache_ratio: float = Field(2.0, ge=0, description="L2 host blocks per L1 block; 0 disables L2 and L3")
    host_cache_gb: float = Field(0.0, ge=0, description="L2 size in GiB; > 0 overrides host_cache_ratio")
    l3_url: str = Field("", description="shared L3 store: file:///dir, redis://host:port, mooncake://...; empty: none")
    l3_timeout_s: float = Field(5.0, gt=0, description="connecting to the L3 store, and each call where the store allows")
    l3_write_policy: Literal["write_through", "write_through_selective", "write_back"] = "write_through"
    l3_prefetch_policy: Literal["best_effort", "wait_complete", "timeout"] = "timeout"
    l3_prefetch_threshold_tokens: int = Field(256, ge=0)
    l3_prefetch_timeout_base_s: float = Field(2.0, ge=0)
    l3_prefetch_timeout_per_ki_token_s: float = Field(0.1, ge=0)
    grammar_cache_size: int = Field(256, gt=0, description="compiled output constraints kept (least recently used dropped)")
    grammar_compile_threads: int = Field(2, gt=0, description="threads compiling output constraints beside the engine")
    tool_call_format: str = Field(
        "", description="hermes | llama3_json: the tool-call format whatever the chat template; empty: from the template"
    )
    kv_events: bool = Field(True, description="publish KV cache events on cv.kv.events.<worker_id>")
    # A peer engine behind the worker contract (docs/engines.md): the worker fronts its server.
    engine: Literal["clairvoyant", "vllm", "sglang"] = Field(
        "clairvoyant", description="clairvoyant: our engine; vllm | sglang: front a co-located server of that engine"
    )
    engine_url: str = Field("", description="a running engine server to front; empty: the worker starts one")
    engine_python: str = Field(
        "", description="interpreter that starts the engine; empty: var/vllm-venv/bin/python for vllm when present, else this one"
    )
    engine_model: str = Field("", description="what the engine loads (HF directory or hub id); empty: model")
    engine_port: int = Field(0, ge=0, le=65535, description="the started engine's HTTP port; 0: worker_http_port, or a free one when that is 0 too")
    engine_kv_events_port: int = Field(0, ge=0, le=65535, description="port the worker binds for the engine's KV events; 0 picks a free one")
    engine_args: str = Field("", description="extra command-line arguments for the started engine (shell-quoted)")
    engine_start_timeout_s: float = Field(600.0, gt=0, description="how long the started engine may take to answer /health")
    engine_log: str = Field("", description="the started engine's output; empty: var/engines/<worker_id>.log")

    @field_validator("l3_url")
    @classmethod
    def _known_l3_scheme(cls, url: str) -> str:
        if url and urlsplit(url).scheme not in L3_BACKENDS:
            schemes = ", ".join(f"{scheme}://" for scheme in L3_BACKENDS.names())
            raise ValueError(f"CV_L3_URL must start with one of {schemes}; got {mask_url(url)!r}")
        return url

    @model_validator(mode="after")
    def _l3_needs_l2(self) -> WorkerSettings:
        if self.l3_url and not self.host_cache_enabled:
            raise ValueError("CV_L3_URL needs an L2 host cache: set CV_HOST_CACHE_RATIO or CV_HOST_CACHE_GB above 0")
        return self

    @property
    def host_cache_enabled(self) -> bool:
        return self.host_cache_ratio > 0 or self.host_cache_gb > 0

    def resolved_worker_id(self) -> str:
        return self.worker_id or f"{socket.gethostname()}-{self.worker_grpc_port}"
