"""``live-compare --engine vllm``: workers that front real vLLM servers (CPU build, SmolLM2-135M),
and what is read from those servers around each arm.

    worker × N (CV_ENGINE=vllm: each starts its own vLLM server, bound to one core, 1 GiB of KV)
    arm vllm-router-rr        driver ─> vllm-router (round_robin)                 ─> vLLM servers
    arm vllm-router-session   driver ─> vllm-router (consistent_hash, x-session-id) ─> vLLM servers
    arm <preset>              driver ─> gateway ─> scheduler(<preset>) ─> workers ─> vLLM servers

The routers reach the servers at the workers' ``http_address`` (the vLLM server's own URL), not
through our workers.  Every call of the workload names the one served model.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from clairvoyant.bench.live.fleet import WorkerSpec

# bench/src/clairvoyant/bench/live/vllm_fleet.py -> the repository root
ROOT = Path(__file__).resolve().parents[5]
VLLM_PYTHON = ROOT / "var/vllm-venv/bin/python"  # ``make install-vllm``
CHECKPOINT = ROOT / "var/models/smollm2-135m-instruct"
SERVED_MODEL = "smollm2-135m-instruct"
# A prompt's characters are at most as many tokens (react_bfcl's reach 2,501, with replies up to 95
# tokens); 2048 is too few once SmolLM2's replies are copied into later prompts.
MAX_MODEL_LEN = 4096
KV_CACHE_MB = 1024  # vLLM's CPU KV space is whole GiB
SESSION_HEADER = "x-session-id"
ROUTER_POLICIES = {"vllm-router-rr": "round_robin", "vllm-router-session": "consistent_hash"}


def vllm_installed() -> bool:
    return VLLM_PYTHON.exists() and (CHECKPOINT / "model.safetensors").exists()


def vllm_worker_specs(count: int, max_num_seqs: int, var_dir: Path) -> list[WorkerSpec]:
    """``count`` workers of SmolLM2, the i-th vLLM server's OpenMP thread bound to core i (mod the
    cores there are), so that two servers on two cores do not contend for one."""
    cores = os.cpu_count() or 1
    specs = []
    for index in range(count):
        env = {
            "CV_ENGINE": "vllm", "CV_ENGINE_PYTHON": str(VLLM_PYTHON), "CV_ENGINE_MODEL": str(CHECKPOINT),
            "CV_MAX_NUM_SEQS": str(max_num_seqs), "CV_MAX_MODEL_LEN": str(MAX_MODEL_LEN),
            "CV_KV_CACHE_MB": str(KV_CACHE_MB), "CV_ENGINE_LOG": str(var_dir / f"vllm-{index}.log"),
            "VLLM_CPU_OMP_THREADS_BIND": str(index % cores),
        }  # fmt: skip
        specs.append(WorkerSpec(f"vllm-{index}", SERVED_MODEL, env))
    return specs


@dataclass(frozen=True)
class EngineCounters:
    """vLLM's own counters (prefix-cache figures are in tokens), of one server or summed."""

    prefix_cache_hits: float
    prefix_cache_queries: float
    preemptions: float

    @classmethod
    def parse(cls, metrics_text: str) -> EngineCounters:
        """From a ``/metrics`` page, each counter summed over its label sets."""

        def counter(name: str) -> float:
            prefix = name + "{"
            return sum(float(line.rsplit(" ", 1)[1]) for line in metrics_text.splitlines() if line.startswith(prefix))

        return cls(
            counter("vllm:prefix_cache_hits_total"),
            counter("vllm:prefix_cache_queries_total"),
            counter("vllm:num_preemptions_total"),
        )

    def __add__(self, other: EngineCounters) -> EngineCounters:
        return EngineCounters(
            self.prefix_cache_hits + other.prefix_cache_hits,
            self.prefix_cache_queries + other.prefix_cache_queries,
            self.preemptions + other.preemptions,
        )

    def since(self, before: EngineCounters) -> EngineCounters:
        return EngineCounters(
            self.prefix_cache_hits - before.prefix_cache_hits,
            self.prefix_cache_queries - before.prefix_cache_queries,
            self.preemptions - before.preemptions,
        )

    @property
    def hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0


def engine_counters(server_urls: Sequence[str], timeout_s: float = 5.0) -> EngineCounters:
    """Summed over the servers' ``/metrics``.  Raises httpx.HTTPError when one cannot be read."""
    total = EngineCounters(0.0, 0.0, 0.0)
    for url in server_urls:
        page = httpx.get(f"{url}/metrics", timeout=timeout_s)
        page.raise_for_status()
        total += EngineCounters.parse(page.text)
    return total
