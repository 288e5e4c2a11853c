"""What a running stack serves, and the checks a live run makes before it sends a request.

The gateway lists the served models (``/v1/models``); the scheduler's ``Snapshot`` names the preset
it runs and its workers.  A live run measures that one preset, so the policy named on the command
line must be it.  The checks are pure functions of what was read; only ``probe`` and
``preemptions_total`` do I/O.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
import httpx
import openai

from clairvoyant.contracts.v1 import scheduler_pb2, scheduler_pb2_grpc
from clairvoyant.core.grpcutil import channel

SNAPSHOT_TIMEOUT_S = 3.0
_PREEMPTIONS = re.compile(r"^cv_worker_preemptions_total\s+([0-9.eE+]+)\s*$", re.MULTILINE)


class LiveModeError(Exception):
    """A live run cannot go on; the message says why and what to do (the CLI prints it as is)."""


@dataclass(frozen=True)
class LiveWorker:
    worker_id: str
    model: str
    max_batch: int
    kv_blocks_total: int
    http_address: str  # its OpenAI-compatible HTTP endpoint ("" when it serves none)


@dataclass(frozen=True)
class LiveCluster:
    models: tuple[str, ...]  # as the gateway lists them
    policy: str | None  # the scheduler's preset; None when the scheduler was not asked
    workers: tuple[LiveWorker, ...]  # empty when the scheduler was not asked


async def served_models(client: openai.AsyncOpenAI) -> tuple[str, ...]:
    """Raises LiveModeError when the gateway cannot be reached or refuses the key."""
    try:
        page = await client.models.list()
    except openai.APIConnectionError as exc:
        raise LiveModeError(
            f"cannot reach the gateway at {client.base_url} ({exc.__cause__ or exc}); "
            "is the stack running (make run), and is --base-url right?"
        ) from None
    except openai.AuthenticationError:
        raise LiveModeError(f"the gateway at {client.base_url} refused the API key; pass --api-key") from None
    except openai.APIStatusError as exc:
        raise LiveModeError(f"the gateway at {client.base_url} answered /models with {exc.status_code}: {exc.message}") from None
    return tuple(sorted(model.id for model in page.data))


async def scheduler_state(address: str) -> tuple[str, tuple[LiveWorker, ...]]:
    """(preset, workers) from the scheduler's Snapshot.  Raises LiveModeError when unreachable."""
    async with channel(address) as chan:
        try:
            snapshot = await scheduler_pb2_grpc.SchedulerStub(chan).Snapshot(
                scheduler_pb2.SnapshotRequest(), timeout=SNAPSHOT_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            raise LiveModeError(
                f"cannot read the running policy from the scheduler at {address} ({exc.code().name}: "
                f"{exc.details()}); pass --scheduler HOST:PORT, or --scheduler none to take the policy "
                "named on the command line on trust"
            ) from None
    workers = tuple(
        LiveWorker(w.worker_id, w.model, w.max_batch, w.kv_blocks_total, w.http_address)
        for w in sorted(snapshot.workers, key=lambda w: w.worker_id)
    )
    return snapshot.policy, workers


async def probe(client: openai.AsyncOpenAI, scheduler: str | None) -> LiveCluster:
    models = await served_models(client)
    if scheduler is None:
        return LiveCluster(models, None, ())
    policy, workers = await scheduler_state(scheduler)
    return LiveCluster(models, policy, workers)


async def preemptions_total(workers: Sequence[LiveWorker], timeout_s: float = 2.0) -> int | None:
    """The workers' ``cv_worker_preemptions_total`` summed; None when any worker cannot be read."""
    if not workers or not all(w.http_address for w in workers):
        return None
    async with httpx.AsyncClient(timeout=timeout_s) as http:
        try:
            pages = await asyncio.gather(*(http.get(f"{w.http_address}/metrics") for w in workers))
        except httpx.HTTPError:
            return None
    total = 0
    for page in pages:
        found = _PREEMPTIONS.search(page.text)
        if page.status_code != 200 or found is None:
            return None
        total += int(float(found.group(1)))
    return total


def check_policies(requested: Sequence[str], running: str | None) -> str:
    """The one policy a live run measures.  Raises LiveModeError when the list does not match."""
    restart = (
        "a live run measures the preset the running scheduler uses; to compare presets live, restart "
        "the stack once per preset (CV_POLICY=<preset> make run) and run `run --mode live --policy "
        "<preset>` against each"
    )
    if len(requested) != 1:
        where = f" (it runs {running!r})" if running else ""
        raise LiveModeError(f"{len(requested)} policies given{where}: {restart}")
    if running is not None and requested[0] != running:
        raise LiveModeError(f"the stack's scheduler runs {running!r}, not {requested[0]!r}: {restart}")
    return requested[0]


def check_models(needed: Sequence[str], served: Sequence[str]) -> None:
    missing = sorted(set(needed) - set(served))
    if missing:
        raise LiveModeError(
            f"the workload needs model(s) {missing} but the gateway serves {sorted(served) or 'none'}; "
            f"start workers for them (emulated: CV_RUNNER=emulated CV_MODEL={missing[0]} CV_GPU=H100-80G)"
        )
