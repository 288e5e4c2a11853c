"""Runs the synchronous engine core on its own thread and exposes it to asyncio.

The engine (``core.engine.LLMEngine``) is single-threaded by contract.  One thread owns it: it
applies queued commands (add, abort, a call), runs ``step()`` while there is work, and hands each
``RequestOutput`` to the asyncio queue of the request that owns it.  Everything else talks to the
engine only through this class.

When the engine has work it cannot advance (a request waiting on an L3 prefetch, or only transfers
in flight), the thread waits ``STALL_WAIT_S`` for a command instead of spinning; every step
polls the transfers.  After each round, the stats go to ``on_step`` and the KV events to
``on_kv_events`` (both called on the engine thread: they must only hand off, never block).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from clairvoyant.worker.core.engine import EngineRequest, EngineStats, LLMEngine, RequestOutput
from clairvoyant.worker.core.types import KvEvent

logger = logging.getLogger(__name__)

STALL_WAIT_S = 0.005  # how long a stalled engine waits for a command before polling its transfers again


@dataclass(frozen=True)
class _Add:
    request: EngineRequest


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass(frozen=True)
class _Call:
    """Run ``fn(engine)`` on the engine thread between two steps and hand back its result."""

    fn: Callable[[LLMEngine], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


_Item: TypeAlias = RequestOutput | BaseException
_Command: TypeAlias = _Add | _Abort | _Call
T = TypeVar("T")


class AsyncEngine:
    """Thread-safe, asyncio-facing wrapper around one ``LLMEngine``."""

    def __init__(
        self,
        engine: LLMEngine,
        on_step: Callable[[EngineStats], None] | None = None,
        on_kv_events: Callable[[list[KvEvent]], None] | None = None,
    ) -> None:
        self.engine = engine
        self._on_step = on_step
        self._on_kv_events = on_kv_events
        self._commands: queue.SimpleQueue[_Command | None] = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[_Item]]] = {}
        self._lock = threading.Lock()
        self._stats = engine.stats()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._stopped = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._commands.put(None)
        self._thread.join(timeout)

    def stats(self) -> EngineStats:
        """The stats after the most recent step or withdrawal (safe from any thread)."""
        return self._stats

    async def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """``fn(engine)``, run on the engine thread between two steps (the engine is not
        thread-safe); its exception is raised here.  For short work (KV export and import)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._commands.put(_Call(fn, loop, future))
        return await future

    async def withdraw_unstarted(self, reason: Callable[[str], BaseException]) -> list[str]:
        """Withdraw the waiting requests that have produced no token (``LLMEngine.withdraw_unstarted``)
        and end each one's ``generate`` with ``reason(request_id)`` raised; returns their ids."""

        def withdraw(engine: LLMEngine) -> list[str]:
            request_ids = engine.withdraw_unstarted()
            self._stats = engine.stats()  # the heartbeat shows the emptied queue at once
            for request_id in request_ids:
                self._deliver(request_id, reason(request_id))
            return request_ids

        return await self.call(withdraw)

    async def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Submit ``request`` and yield its outputs; leaving early aborts it (every choice) and
        frees its blocks.  With ``sampling.n`` > 1 the outputs of the choices interleave, each
        tagged with its ``index``; the stream ends once every choice has finished.

        Errors from ``add_request`` (e.g. a prompt longer than the context window) are raised here,
        before any output.
        """
        out: asyncio.Queue[_Item] = asyncio.Queue()
        with self._lock:
            if request.request_id in self._streams:
                raise ValueError(f"request id {request.request_id!r} is already running on this worker")
            self._streams[request.request_id] = (asyncio.get_running_loop(), out)
        self._commands.put(_Add(request))
        finished = False
        unfinished_choices = request.sampling.n
        try:
            while not finished:
                item = await out.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                unfinished_choices -= item.finished
                finished = unfinished_choices == 0
                yield item
        finally:
            if not finished:
                self._commands.put(_Abort(request.request_id))
            with self._lock:
                self._streams.pop(request.request_id, None)

    # -- engine thread -------------------------------------------------------------------------

    def _deliver(self, request_id: str, item: _Item) -> None:
        with self._lock:
            target = self._streams.get(request_id)
        if target is not None:
            loop, out = target
            with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
                loop.call_soon_threadsafe(out.put_nowait, item)

    def _apply(self, command: _Command) -> None:
        if isinstance(command, _Call):
            self._run_call(command)
            return
        if isinstance(command, _Abort):
            self.engine.abort_request(command.request_id)
            return
        try:
            self.engine.add_request(command.request)
        except Exception as exc:  # reported to the caller, the engine is unchanged
            self._deliver(command.request.request_id, exc)

    def _run(self) -> None:
        engine = self.engine
        stalled = False  # the last step could not advance anything
        while True:
            pending: list[_Command | None] = []
            try:
                # Idle: sleep until a command arrives.  Stalled: wait a moment, then poll the
                # transfers again.  Busy: just pick up what is already queued.
                if not (engine.has_unfinished() or engine.has_pending_transfers()):
                    pending.append(self._commands.get())
                elif stalled:
                    pending.append(self._commands.get(timeout=STALL_WAIT_S))
                else:
                    pending.append(self._commands.get_nowait())
            except queue.Empty:
                pass
            while True:
                try:
                    pending.append(self._commands.get_nowait())
                except queue.Empty:
                    break
            for command in pending:
                if command is None:
                    return
                self._apply(command)
            stalled = False
            if engine.has_unfinished() or engine.has_pending_transfers():
                try:
                    outputs = engine.step()
                    stalled = not outputs and not engine.last_schedule.chunks
                except Exception:
                    logger.exception("engine step failed; failing the running requests")
                    self._fail_all()
                    outputs = []
                    stalled = True  # a step that keeps failing must not spin either
                for output in outputs:
                    self._deliver(output.request_id, output)
            self._stats = engine.stats()
            if self._on_step is not None:
                self._on_step(self._stats)
            if self._on_kv_events is not None:
                events = engine.drain_kv_events()
                if events:
                    self._on_kv_events(events)

    def _run_call(self, call: _Call) -> None:
        def settle(outcome: Any, failed: bool) -> None:
            if call.future.done():  # the caller gave up (cancelled)
                return
            if failed:
                call.future.set_exception(outcome)
            else:
                call.future.set_result(outcome)

        try:
            outcome, failed = call.fn(self.engine), False
        except Exception as exc:  # the caller's to handle; the engine goes on
            outcome, failed = exc, True
        with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
            call.loop.call_soon_threadsafe(settle, outcome, failed)

    def _fail_all(self) -> None:
        with self._lock:
            request_ids = list(self._streams)
        for request_id in request_ids:
            self.engine.abort_request(request_id)
            self._deliver(request_id, RuntimeError("engine step failed"))
