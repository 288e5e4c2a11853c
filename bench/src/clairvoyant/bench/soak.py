"""``soak``: the local stack under mixed traffic for a long while, with faults injected on a schedule.

Starts the stack (NATS, scheduler, profiler, emulated workers, gateway) on free ports, supervised as
``make run`` supervises it, and sends traffic for ``--duration`` seconds:

* good: chat and text completions, streaming and not, from ``--clients`` concurrent clients;
* bad: malformed JSON, bad parameters, a lone surrogate (``"\\ud800"`` sent as raw JSON bytes), and
  clients that drop a stream after its first chunk.

Four faults split the run into five windows of equal length::

    | baseline | worker SIGKILL | NATS restart | scheduler restart | gateway restart |
    0         D/5             2D/5           3D/5                4D/5              D

Per window (a request belongs to the window it started in): good requests served and failed, bad
ones refused with a 4xx (the right answer) or not, requests hung (no answer within ``--hang-after``
seconds; goal 0), and how long after the fault a new request was first served.  Over the run:
completion records lost (answers with status 200 whose request id never appears on the JetStream
stream ``cv.requests.completed``; goal 0) and placements leaked (the scheduler's ``placed``, summed
over workers, once traffic has stopped; goal 0).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import httpx
import nats
import nats.errors

from clairvoyant.bench.common import BENCHMARKS, BenchResult, progress
from clairvoyant.bench.soak_traffic import MODEL, Answer, Traffic
from clairvoyant.contracts.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from clairvoyant.core.bus import COMPLETIONS_STREAM, COMPLETIONS_SUBJECT
from clairvoyant.stack import Stack, StackConfig

DEFAULT_DURATION_S = 600.0
WINDOWS = ("baseline", "worker SIGKILL", "NATS restart", "scheduler restart", "gateway restart")


@dataclass
class RequestFate:
    """One request's fate."""

    kind: str  # "good" | "bad" | "disconnect"
    started: float  # seconds since the traffic began
    ended: float
    result: str  # good: served | failed; bad: refused | wrong; disconnect: dropped | failed; any: hung
    request_id: str = ""  # from a 200 answer: its completion record must reach the stream
    error: str = ""  # what went wrong, for the notes


class Soak:
    """One run: traffic, the fault schedule and progress lines, all on one event loop."""

    def __init__(self, stack: Stack, args: argparse.Namespace, injector: ThreadPoolExecutor) -> None:
        self.stack = stack
        self.args = args
        # Faults run on this executor's thread, which must outlive the run: a service restarted
        # from a thread gets SIGTERM when that thread ends (``clairvoyant.core.processes.die_with_parent``).
        self.injector = injector
        self.outcomes: list[RequestFate] = []
        self.faults: list[float] = []  # when each fault was injected, seconds since the start
        self.t0 = 0.0

    def now(self) -> float:
        return time.monotonic() - self.t0

    def window_of(self, started: float) -> int:
        return sum(1 for at in self.faults if started >= at)

    async def run(self) -> None:
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        timeout = httpx.Timeout(self.args.hang_after + 10)  # the hang bound below fires first
        async with httpx.AsyncClient(base_url=self.stack.gateway_url, limits=limits, timeout=timeout) as client:
            self.t0 = time.monotonic()
            rng = random.Random(self.args.seed)
            clients = [self._client("good", Traffic(client, random.Random(rng.random())), i)
                       for i in range(self.args.clients)]  # fmt: skip
            clients += [self._client("bad", Traffic(client, random.Random(rng.random())), i)
                        for i in range(self.args.bad_clients)]  # fmt: skip
            tasks = [asyncio.create_task(c) for c in clients]
            reporter = asyncio.create_task(self._report_progress())
            await self._inject_faults()
            await asyncio.gather(*tasks)  # each stops at the end of the run, its last request bounded
            reporter.cancel()

    async def _client(self, kind: str, traffic: Traffic, index: int) -> None:
        n = 0
        while self.now() < self.args.duration:
            n += 1
            if kind == "good":
                await self._send("good", partial(traffic.good, index, n))
                await asyncio.sleep(traffic.rng.uniform(0, self.args.think))
            elif n % 4 == 0:
                await self._send("disconnect", traffic.disconnect)
                await asyncio.sleep(traffic.rng.uniform(0, 1.0))
            else:
                await self._send("bad", traffic.bad)
                await asyncio.sleep(traffic.rng.uniform(0, 1.0))

    async def _send(self, kind: str, send: Callable[[], Awaitable[Answer]]) -> None:
        started = self.now()
        try:
            async with asyncio.timeout(self.args.hang_after):
                answer = await send()
        except TimeoutError:
            answer = Answer("hung", "", f"no answer within {self.args.hang_after:.0f} s")
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            answer = Answer("failed", "", f"{type(exc).__name__}: {exc}"[:160])
        self.outcomes.append(RequestFate(kind, started, self.now(), *answer))

    async def _inject_faults(self) -> None:
        for k, fault in enumerate(WINDOWS[1:], start=1):
            await asyncio.sleep(max(0.0, k * self.args.duration / len(WINDOWS) - self.now()))
            self.faults.append(self.now())
            progress(f"fault {k}: {fault}")
            await asyncio.get_running_loop().run_in_executor(self.injector, self._inject, fault)
        await asyncio.sleep(max(0.0, self.args.duration - self.now()))

    def _inject(self, fault: str) -> None:
        """Runs in a thread: a planned restart waits for the old process to exit."""
        if fault == "worker SIGKILL":
            dict(self.stack.children)["worker-2"].send_signal(signal.SIGKILL)  # the supervisor restarts it
        else:
            self.stack.restart(fault.split()[0].lower())  # nats | scheduler | gateway

    async def _report_progress(self) -> None:
        while True:
            await asyncio.sleep(self.args.progress_every)
            window = self.window_of(self.now())
            mine = Counter(o.result for o in self.outcomes if o.kind == "good" and self.window_of(o.started) == window)
            total = Counter(o.result for o in self.outcomes)
            progress(f"{self.now():5.0f}/{self.args.duration:.0f} s  [{WINDOWS[window]}] good served "
                     f"{mine['served']} failed {mine['failed']} hung {mine['hung']} | run: "
                     f"{len(self.outcomes)} requests, {total['hung']} hung")  # fmt: skip


async def completion_records(nats_url: str, expected: set[str], settle_s: float) -> Counter[str]:
    """How many records each request id has on the stream, read once ``expected`` are all there or
    no new record arrived for ``settle_s`` seconds (a record follows its reply)."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        counts: Counter[str] = Counter()
        read, last_growth = 0, time.monotonic()
        sub = await js.subscribe(COMPLETIONS_SUBJECT, ordered_consumer=True)
        while not expected <= set(counts) and time.monotonic() - last_growth < settle_s:
            info = await js.stream_info(COMPLETIONS_STREAM)
            while read < info.state.messages:
                try:
                    msg = await sub.next_msg(timeout=2)
                except nats.errors.TimeoutError:
                    break
                counts[common_pb2.CompletionRecord.FromString(msg.data).request_id] += 1
                read += 1
                last_growth = time.monotonic()
            await asyncio.sleep(0.5)
        await sub.unsubscribe()
        return counts
    finally:
        await nc.close()


def placements(stack: Stack, settle_s: float) -> tuple[int, int]:
    """(placements not released, workers registered), once none is left or ``settle_s`` has passed."""
    deadline = time.monotonic() + settle_s
    with grpc.insecure_channel(stack.scheduler_address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        while True:
            snapshot = stub.Snapshot(scheduler_pb2.SnapshotRequest(), timeout=10)
            placed = sum(w.placed for w in snapshot.workers)
            if placed == 0 or time.monotonic() > deadline:
                return placed, len(snapshot.workers)
            time.sleep(0.5)


@contextmanager
def supervised(stack: Stack) -> Iterator[None]:
    """``stack.supervise()`` twice a second in a thread, as ``make run`` does in its main loop."""
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            stack.supervise()
            done.wait(0.5)

    thread = threading.Thread(target=loop, name="supervisor", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def window_rows(soak: Soak) -> list[list[Any]]:
    rows = []
    for index, name in enumerate(WINDOWS):
        fault_at = soak.faults[index - 1] if index else 0.0
        mine = [o for o in soak.outcomes if soak.window_of(o.started) == index]
        count = Counter((o.kind, o.result) for o in mine)
        served_at = [o.ended for o in mine if o.kind == "good" and o.result == "served"]
        rows.append([
            name, round(fault_at), sum(v for (k, _), v in count.items() if k == "good"),
            count["good", "served"], count["good", "failed"], sum(v for (_, r), v in count.items() if r == "hung"),
            count["bad", "refused"], count["bad", "wrong"], count["disconnect", "dropped"],
            round(min(served_at) - fault_at, 1) if index and served_at else None,
        ])  # fmt: skip
    return rows


def error_notes(soak: Soak, limit: int = 3) -> list[str]:
    """The commonest errors of each window and kind of request."""
    notes = []
    for index, name in enumerate(WINDOWS):
        for kind in ("good", "bad", "disconnect"):
            errors = Counter(o.error for o in soak.outcomes
                             if o.error and o.kind == kind and soak.window_of(o.started) == index)  # fmt: skip
            notes += [f"{name}, {kind}: {n} x {error}" for error, n in errors.most_common(limit)]
    return notes


@BENCHMARKS.register("soak")
class SoakBenchmark:
    help = "the local stack under good and bad traffic with a worker kill and NATS/scheduler/gateway restarts"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--duration", type=float, default=DEFAULT_DURATION_S,
                            help="seconds of traffic, faults at 1/5 .. 4/5 (results: soak.json, else soak-<N>s.json)")
        parser.add_argument("--workers", type=int, default=3, help="emulated workers")
        parser.add_argument("--clients", type=int, default=6, help="concurrent clients sending good requests")
        parser.add_argument("--bad-clients", type=int, default=2, help="clients sending bad requests and disconnects")
        parser.add_argument("--think", type=float, default=0.5, help="most seconds a good client waits between requests")
        parser.add_argument("--hang-after", type=float, default=60.0, help="a request with no answer by then is hung")
        parser.add_argument("--progress-every", type=float, default=10.0, help="seconds between progress lines")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--keep-logs", type=Path, help="keep the services' logs in this directory")
        parser.add_argument("--quick", action="store_true", help="60 s of traffic")

    def run(self, args: argparse.Namespace) -> BenchResult:
        if args.quick:
            args.duration = min(args.duration, 60.0)
        with tempfile.TemporaryDirectory(prefix="cv-soak-") as tmp:
            log_dir = args.keep_logs or Path(tmp) / "logs"
            config = StackConfig.on_free_ports(Path(tmp), model=MODEL, workers=args.workers,
                                               worker_env={"CV_RUNNER": "emulated"}, log_dir=log_dir)  # fmt: skip
            progress(f"starting the stack ({args.workers} emulated {MODEL} workers); service logs in {log_dir}")
            stack = Stack(config).start(ready_timeout=180)
            try:
                with supervised(stack), ThreadPoolExecutor(1, thread_name_prefix="faults") as injector:
                    soak = Soak(stack, args, injector)
                    progress(f"traffic for {args.duration:.0f} s: {args.clients} good clients, {args.bad_clients} bad")
                    asyncio.run(soak.run())
                    progress("traffic stopped; reading completion records and the scheduler's placements")
                    answered = {o.request_id for o in soak.outcomes if o.request_id}
                    records = asyncio.run(completion_records(stack.nats_url, answered, settle_s=20.0))
                    leaked, workers = placements(stack, settle_s=20.0)
                    restarts = {s.name: s.restarts for s in stack.services if s.restarts}
            finally:
                stack.stop()
        lost = sorted(answered - set(records))
        hung = sum(1 for o in soak.outcomes if o.result == "hung")
        summary: dict[str, Any] = {
            "requests": len(soak.outcomes),
            "answered_200": len(answered),
            "hung": hung,
            "records_lost": len(lost),
            "records_duplicated": sum(1 for r in answered if records[r] > 1),
            "placements_leaked": leaked,
            "workers_at_end": workers,
            "crash_restarts": restarts,
            "goal": "hung 0, records_lost 0, placements_leaked 0",
        }
        notes = [
            "a request belongs to the window it started in; 'first served' is seconds from the fault "
            "until the first request started after it was served",
            "bad 4xx: refused with a 4xx and an OpenAI error object (right); bad wrong: anything else",
            *error_notes(soak),
        ]
        if lost:
            notes.append(f"request ids answered 200 without a record (first 5): {', '.join(lost[:5])}")
        return BenchResult(
            name="soak" if args.duration == DEFAULT_DURATION_S else f"soak-{args.duration:.0f}s",
            columns=["window", "from s", "good", "served", "failed", "hung", "bad 4xx", "bad wrong",
                     "dropped streams", "first served s"],  # fmt: skip
            rows=window_rows(soak),
            summary=summary,
            notes=notes,
            params={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                    if k not in ("command", "out_dir")},  # fmt: skip
        )
