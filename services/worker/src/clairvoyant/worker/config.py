"""Worker settings (environment prefix ``CV_``)."""

from __future__ import annotations

import socket

from pydantic import Field

from clairvoyant.core.config import ServiceSettings

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

    def resolved_worker_id(self) -> str:
        return self.worker_id or f"{socket.gethostname()}-{self.worker_grpc_port}"
