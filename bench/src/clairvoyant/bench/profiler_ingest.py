"""``profiler-ingest``: records/s the profiler service learns, logs and acks from JetStream.

    python -m clairvoyant.bench profiler-ingest                          # SQLite; PostgreSQL too
    python -m clairvoyant.bench profiler-ingest --database-url postgresql+psycopg://postgres@127.0.0.1/test
    python -m clairvoyant.bench profiler-ingest --records 20000 --history 0 --batch-size 256,1024

For each database and each history (a profile that starts fresh, and one that already remembers
``--history`` request ids), ``--records`` generated completion records of one workflow type are
published to a private NATS server (a child nats-server on a free port) before the real
``ProfilerApp`` starts; the clock runs from the end of its start-up (restoring the profile
from the database, not timed) until JetStream reports every record acked, so the rate includes
decoding, learning, the log appends, the periodic snapshots and the acks.  PostgreSQL runs when
``--database-url`` or ``CV_TEST_DATABASE_URL`` names one (in a schema of its own, dropped after).

The baseline is the pure core in the same process: ``ProfileStore.ingest`` of the same records
from the same starting state, already decoded.  The service's final state is compared with it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import nats

from clairvoyant.bench.common import BENCHMARKS, BenchResult, progress
from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.bus import COMPLETIONS_STREAM, COMPLETIONS_SUBJECT
from clairvoyant.core.clock import ManualClock
from clairvoyant.profiler import convert
from clairvoyant.profiler.app import ProfilerApp
from clairvoyant.profiler.config import ProfilerSettings
from clairvoyant.profiler.core import ProfileStore, WorkflowProfile
from clairvoyant.profiler.persistence import ProfileRepository, ProfileSnapshot, scratch_schema
from clairvoyant.stack.natsserver import NatsServer

TENANT = "bench"
WORKFLOW_TYPE = "coding_assistant"
EPOCH = 1_700_000_000.0
GOAL = 5_000.0  # records/s, sustained


def coding_records(instances: int, *, seed: int, first: int = 0) -> list[common_pb2.CompletionRecord]:
    """``instances`` coding-assistant workflows (plan, explore, edit/review loop, verify), eight in
    flight at a time, as the gateway publishes them: ordered by end time, the last call of each
    carrying ``workflow_end``."""
    rng = random.Random(seed)
    timed: list[tuple[float, common_pb2.CompletionRecord]] = []
    for i in range(first, first + instances):
        workflow_id = f"w{i}"
        agents = ["planner"] + ["explorer"] * rng.randint(2, 4)
        for _ in range(rng.randint(1, 3)):
            agents += ["engineer"] * rng.randint(1, 4) + ["reviewer"]
        agents.append("verifier")
        now = EPOCH + (i // 8) * 600.0 + (i % 8) * 7.0
        for j, agent in enumerate(agents):
            service_s = rng.uniform(1.0, 12.0)
            meta = common_pb2.AppMetadata(workflow_type_id=WORKFLOW_TYPE, workflow_id=workflow_id, agent_id=agent)
            if j:
                meta.upstream_agent_id = agents[j - 1]
            meta.workflow_end = j == len(agents) - 1
            record = common_pb2.CompletionRecord(
                request_id=f"{workflow_id}-r{j}",
                tenant=TENANT,
                app_metadata=meta,
                model="m",
                prompt_tokens=rng.randint(500, 4000),
                output_tokens=int(rng.lognormvariate(5.5 if agent != "verifier" else 3.5, 0.5)),
                timing=common_pb2.Timing(arrival_time=now, end_time=now + service_s),
                status=common_pb2.REQUEST_STATUS_OK,
            )
            timed.append((now + service_s, record))
            now += service_s + rng.uniform(0.0, 2.0)
    timed.sort(key=lambda pair: pair[0])
    return [record for _, record in timed]


def records_for(count: int, *, seed: int, first: int = 0) -> list[common_pb2.CompletionRecord]:
    """At least ``count`` records of whole workflows (about 11 calls each), cut to ``count``."""
    records = coding_records(count // 8 + 8, seed=seed, first=first)
    return records[:count]


def pure_rate(records: list[common_pb2.CompletionRecord], start: WorkflowProfile | None) -> tuple[float, Any]:
    """The core alone: records/s of ProfileStore.ingest from ``start``'s state, and the final state."""
    keyed = [convert.call_record(m) for m in records]
    store = ProfileStore(ProfilerSettings.model_validate({}).profile_config())  # the service's model settings
    if start is not None:
        store.profiles[(TENANT, WORKFLOW_TYPE)] = WorkflowProfile.from_state(start.to_state())
    began = time.perf_counter()
    for item in keyed:
        assert item is not None
        store.ingest(*item)
    elapsed = time.perf_counter() - began
    return len(keyed) / elapsed, store.profile(TENANT, WORKFLOW_TYPE).to_state()


class Run(NamedTuple):
    wall_s: float
    restore_s: float
    final_snapshot_s: float
    state: Any


@contextmanager
def database(kind: str, postgres_url: str | None, workdir: Path) -> Iterator[str]:
    """A database URL with no profiler tables: a fresh SQLite file, or a fresh PostgreSQL schema."""
    if kind == "sqlite":
        yield f"sqlite:///{workdir / f'profiler-{uuid.uuid4().hex[:8]}.db'}"
        return
    assert postgres_url is not None
    with scratch_schema(postgres_url, prefix="bench_profiler") as url:
        yield url


async def service_run(
    records: list[common_pb2.CompletionRecord], database_url: str, workdir: Path, args: argparse.Namespace,
    batch_size: int,
) -> Run:
    """Publish ``records``, start the service on ``database_url``, time until all are acked."""
    server = NatsServer(workdir / f"nats-{uuid.uuid4().hex[:8]}").start()
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await js.add_stream(name=COMPLETIONS_STREAM, subjects=[COMPLETIONS_SUBJECT])
        payloads = [m.SerializeToString() for m in records]
        for i in range(0, len(payloads), 1000):  # publish acks in flight, a thousand at a time
            await asyncio.gather(*(js.publish(COMPLETIONS_SUBJECT, p) for p in payloads[i : i + 1000]))
        settings = ProfilerSettings.model_validate({
            "nats_url": server.url, "database_url": database_url, "profiler_port": 0, "metrics_port": 0,
            "batch_size": batch_size, "fetch_timeout_s": 0.2, "snapshot_interval_s": args.snapshot_interval,
            "snapshot_every_records": args.snapshot_every,
        })  # fmt: skip
        # The records' own time scale, standing still: no instance goes idle during the run.
        service = ProfilerApp(settings, clock=ManualClock(EPOCH))
        began = time.perf_counter()
        await service.start()
        restored = time.perf_counter()
        try:
            while True:
                try:
                    info = await js.consumer_info(COMPLETIONS_STREAM, settings.consumer_name)
                except nats.js.errors.NotFoundError:
                    pass  # not bound yet
                else:
                    if info.ack_floor.stream_seq >= len(records):
                        break
                await asyncio.sleep(0.02)
            done = time.perf_counter()
        finally:
            await service.stop()
        stopped = time.perf_counter()
        state = service.store.profile(TENANT, WORKFLOW_TYPE).to_state()
        await nc.close()
        return Run(done - restored, restored - began, stopped - done, state)
    finally:
        server.stop()


@BENCHMARKS.register("profiler-ingest")
class ProfilerIngest:
    help = "profiler service ingestion: records/s learned, logged and acked (goal >= 5,000/s)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--records", type=int, default=50_000, help="records published and timed per run")
        parser.add_argument(
            "--history", type=int, default=95_000, help="request ids the profile remembers before the 2nd run"
        )
        parser.add_argument("--batch-size", default="256", help="comma-separated CV_BATCH_SIZE values")
        parser.add_argument("--snapshot-every", type=int, default=ProfilerSettings.model_fields[
            "snapshot_every_records"].default, help="CV_SNAPSHOT_EVERY_RECORDS")  # fmt: skip
        parser.add_argument("--snapshot-interval", type=float, default=ProfilerSettings.model_fields[
            "snapshot_interval_s"].default, help="CV_SNAPSHOT_INTERVAL_S")  # fmt: skip
        parser.add_argument("--database-url", default=os.environ.get("CV_TEST_DATABASE_URL"),
                            help="a PostgreSQL to measure too (default: $CV_TEST_DATABASE_URL)")  # fmt: skip
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--quick", action="store_true", help="5,000 records, a 10,000-id history")

    def run(self, args: argparse.Namespace) -> BenchResult:
        count = 5_000 if args.quick else args.records
        history_ids = 10_000 if args.quick else args.history
        backends = ["sqlite"] + (["postgresql"] if args.database_url else [])
        batches = [int(b) for b in args.batch_size.split(",") if b]
        history_records = records_for(history_ids, seed=args.seed + 1) if history_ids else []
        # The timed records continue the history's workflow ids, so none is a duplicate of it.
        timed = records_for(count, seed=args.seed, first=history_ids)
        progress(f"{len(timed):,} records to time; building a {len(history_records):,}-id history")
        history = ProfileStore(ProfilerSettings.model_validate({}).profile_config()).profile(TENANT, WORKFLOW_TYPE)
        for msg in history_records:
            keyed = convert.call_record(msg)
            assert keyed is not None
            history.ingest(keyed.record)
        rows: list[list[Any]] = []
        summary: dict[str, Any] = {}
        with tempfile.TemporaryDirectory(prefix="profiler-ingest-") as tmp:
            workdir = Path(tmp)
            starts: list[tuple[str, WorkflowProfile | None]] = [("fresh", None)]
            if history_ids:
                starts.append((f"{history_ids:,} ids", history))
            for label, start in starts:
                pure, pure_state = pure_rate(timed, start)
                progress(f"{label}: pure ProfileStore.ingest {pure:,.0f} records/s")
                for backend in backends:
                    for batch_size in batches:
                        with database(backend, args.database_url, workdir) as url:
                            if start is not None:
                                repository = ProfileRepository(url)
                                repository.save([ProfileSnapshot.of(start)])
                                repository.close()
                            run = asyncio.run(service_run(timed, url, workdir, args, batch_size))
                        rate = len(timed) / run.wall_s
                        same = run.state == pure_state
                        progress(f"{label}, {backend}, batch {batch_size}: {rate:,.0f} records/s "
                                 f"({rate / pure:.2f} of pure), state equal to pure: {same}")  # fmt: skip
                        rows.append([label, backend, batch_size, len(timed), run.wall_s, rate, pure, rate / pure,
                                     rate / GOAL, run.restore_s, run.final_snapshot_s, "yes" if same else "NO"])  # fmt: skip
                        summary[f"{backend}, {label}, batch {batch_size} (records/s)"] = rate
        summary["goal"] = f">= {GOAL:,.0f} records/s sustained, on a fresh profile and with a long history"
        notes = [
            "records/s: from the end of start-up until JetStream reports every record acked (learned, "
            "logged in one transaction per batch, acked), snapshots included; pure: ProfileStore.ingest "
            "of the same already-decoded records in this process, from the same starting state",
            "restore s: start-up (migrations, the history's snapshot read and restored); final snapshot s: "
            "the graceful stop, which snapshots every changed profile",
        ]
        return BenchResult(
            name="profiler-ingest",
            columns=["start", "database", "batch", "records", "wall s", "records/s", "pure records/s",
                     "x pure", "x goal", "restore s", "final snapshot s", "state = pure"],  # fmt: skip
            rows=rows,
            summary=summary,
            notes=notes,
            params={k: v for k, v in vars(args).items() if k not in ("func", "out_dir", "database_url")}
            | {"postgresql": bool(args.database_url)},
        )
