"""A peer engine's KV events, re-hashed into ours and published on ``cv.kv.events.<worker_id>``.

vLLM (``--kv-events-config``, publisher ``zmq``) and SGLang (the same format, ported from vLLM)
send each event batch as a ZMQ multipart message ``(topic, sequence as 8 big-endian bytes,
msgpack payload)``.  The payload is an ``EventBatch`` encoded as an array ``[ts, events,
data_parallel_rank]``; each event is a map tagged by ``type``:

    BlockStored       block_hashes, parent_block_hash (None at the root), token_ids,
                      block_size, medium ("GPU" / "CPU"), session_id (the request's, when set)
    BlockRemoved      block_hashes, medium
    AllBlocksCleared

The engine's hashes are its own (SHA-256 over its block size, salted per tenant); the cache
manager reads ours (``clairvoyant.core.blockhash``, 16-token blocks).  ``KvBridge`` keeps a
mirror of the engine's blocks, ``engine hash -> (tenant, our hashes, our parent)``, so that

* a stored block is re-hashed from its tokens, chained from its parent's last hash of ours;
* a removed block is named by the hashes we published for it;
* a resync (``cv.kv.resync``) is answered from the mirror, as our own engine answers from its
  radix tree.

When a block's parent was never seen (a batch lost: the sequence number jumps), the block cannot
be re-hashed: it is dropped and counted (``cv_worker_kv_events_untranslatable_total``), and the
gap is logged.  The worker binds the socket before it starts the engine, so nothing is lost at
start-up.  The engine's block size must be a multiple of 16.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import msgpack
import zmq

from clairvoyant.core.blockhash import BLOCK_TOKENS, chain_hashes
from clairvoyant.worker.core.radix_cache import BlockTag
from clairvoyant.worker.core.sequence import Lineage
from clairvoyant.worker.core.types import KvEvent, Tier
from clairvoyant.worker.metrics import KV_EVENTS_UNTRANSLATABLE

logger = logging.getLogger(__name__)

_MEDIUM_TIERS: dict[str, Tier] = {"GPU": 1, "CPU": 2, "CPU_PINNED": 2}  # vLLM; SGLang names its host tier CPU_PINNED


@dataclass(frozen=True)
class RequestInfo:
    """What the bridge needs of a request its engine names in ``session_id``."""

    lineage: Lineage
    prompt_tokens: int


@dataclass(frozen=True)
class _Block:
    namespace: str | None
    hashes: tuple[int, ...]  # ours: block_size / 16 of them
    parent: int | None  # our hash of the previous block (None at the root)
    depth: int  # our blocks before this one
    tag: BlockTag | None


class KvTranslator:
    """Engine events -> our ``KvEvent``s (no I/O; the bridge's thread calls it)."""

    def __init__(self, lookup: Callable[[str], RequestInfo | None]) -> None:
        self._lookup = lookup
        self._blocks: dict[tuple[Tier, object], _Block] = {}
        self.untranslatable = 0

    def translate(self, events: list[dict[str, object]]) -> list[KvEvent]:
        out: list[KvEvent] = []
        for event in events:
            kind = event.get("type")
            if kind == "BlockStored":
                out.extend(self._stored(event))
            elif kind == "BlockRemoved":
                out.extend(self._removed(event))
            elif kind == "AllBlocksCleared":
                self._blocks.clear()
                out.append(KvEvent("cleared", 1, None, ()))
        return out

    def snapshot(self) -> list[KvEvent]:
        """CLEARED, then every block held, parents first: what a subscriber rebuilds from."""
        events = [KvEvent("cleared", 1, None, ()), KvEvent("cleared", 2, None, ())]
        for (tier, _), block in self._blocks.items():
            events.append(KvEvent("stored", tier, block.namespace, block.hashes, block.parent, block.tag))
        return events

    def _stored(self, event: dict[str, object]) -> list[KvEvent]:
        tier = _MEDIUM_TIERS.get(str(event.get("medium") or "GPU"), 1)
        size = int(event.get("block_size") or 0)  # type: ignore[call-overload]
        tokens: list[int] = list(event.get("token_ids") or [])  # type: ignore[call-overload]
        engine_hashes: list[object] = list(event.get("block_hashes") or [])  # type: ignore[call-overload]
        if size <= 0 or size % BLOCK_TOKENS or len(tokens) != size * len(engine_hashes):
            self.untranslatable += len(engine_hashes)
            KV_EVENTS_UNTRANSLATABLE.inc(len(engine_hashes))
            return []
        parent_key = event.get("parent_block_hash")
        parent_block = self._blocks.get((tier, parent_key)) if parent_key is not None else None
        if parent_key is not None and parent_block is None:  # its parent's event was lost
            self.untranslatable += len(engine_hashes)
            KV_EVENTS_UNTRANSLATABLE.inc(len(engine_hashes))
            return []
        info = self._lookup(str(event.get("session_id") or ""))
        namespace = (
            info.lineage.tenant if info is not None else (parent_block.namespace if parent_block else None)
        )
        previous = parent_block.hashes[-1] if parent_block else None
        depth = parent_block.depth + len(parent_block.hashes) if parent_block else 0
        out: list[KvEvent] = []
        for index, engine_hash in enumerate(engine_hashes):
            ours = tuple(chain_hashes(tokens[index * size : (index + 1) * size], previous or 0))
            self._blocks[(tier, engine_hash)] = _Block(
                namespace, ours, previous, depth, self._tag(info, depth)
            )
            # One event per run of our blocks with the same tag: a 32-token block can end a prompt
            # in its first half and hold response tokens in its second.
            for position, our_hash in enumerate(ours):
                tag = self._tag(info, depth + position)
                last = out[-1] if out else None
                if last is not None and last.tag == tag and last.block_hashes[-1] == previous:
                    out[-1] = KvEvent(
                        "stored", tier, namespace, (*last.block_hashes, our_hash), last.parent_hash, tag
                    )
                else:
                    out.append(KvEvent("stored", tier, namespace, (our_hash,), previous, tag))
                previous = our_hash
            depth += len(ours)
        return out

    @staticmethod
    def _tag(info: RequestInfo | None, depth: int) -> BlockTag | None:
        """The tag of our block ``depth`` (0 = the first) of ``info``'s request."""
        if info is None:
            return None
        in_prompt = (depth + 1) * BLOCK_TOKENS <= info.prompt_tokens
        return BlockTag(info.lineage, "prompt" if in_prompt else "response")

    def _removed(self, event: dict[str, object]) -> list[KvEvent]:
        tier = _MEDIUM_TIERS.get(str(event.get("medium") or "GPU"), 1)
        by_namespace: dict[str | None, list[int]] = {}
        for engine_hash in event.get("block_hashes") or []:  # type: ignore[attr-defined]
            block = self._blocks.pop((tier, engine_hash), None)
            if block is not None:
                by_namespace.setdefault(block.namespace, []).extend(block.hashes)
        return [KvEvent("removed", tier, ns, tuple(hashes)) for ns, hashes in by_namespace.items()]


class RecentRequests:
    """The lineage of the last ``capacity`` requests, by request id (thread-safe): an engine
    reports a block's request after the fact, sometimes after the request has finished."""

    def __init__(self, capacity: int = 4096) -> None:
        self._items: OrderedDict[str, RequestInfo] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()

    def add(self, request_id: str, info: RequestInfo) -> None:
        with self._lock:
            self._items[request_id] = info
            self._items.move_to_end(request_id)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)

    def get(self, request_id: str) -> RequestInfo | None:
        with self._lock:
            return self._items.get(request_id)


class KvBridge:
    """Binds a ZMQ SUB socket on ``endpoint`` (the engine's publisher connects to it) and feeds
    translated batches to ``submit`` (``KvEventPublisher.submit``) from its own thread."""

    POLL_MS = 200

    def __init__(
        self,
        endpoint: str,
        submit: Callable[[list[KvEvent]], None],
        lookup: Callable[[str], RequestInfo | None],
    ) -> None:
        self.endpoint = endpoint
        self._submit = submit
        self.translator = KvTranslator(lookup)
        self._lock = threading.Lock()  # the translator is shared with resync
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.setsockopt(zmq.RCVHWM, 100_000)
        self._socket.bind(endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-bridge", daemon=True)
        self.last_sequence: int | None = None
        self.gaps = 0

    def start(self) -> None:
        self._thread.start()

    def resync(self) -> None:
        """Publish a snapshot of the mirror (CLEARED, then every block), numbered in order."""
        with self._lock:
            self._submit(self.translator.snapshot())

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(self.POLL_MS):
                continue
            try:
                _topic, sequence, payload = self._socket.recv_multipart(zmq.NOBLOCK)
                self._handle(int.from_bytes(sequence, "big"), msgpack.unpackb(payload))
            except zmq.Again:
                continue
            except Exception:  # one bad message must not stop the bridge
                logger.exception("could not translate a KV event batch from the engine")

    def _handle(self, sequence: int, batch: list[object]) -> None:
        if self.last_sequence is not None and sequence != self.last_sequence + 1:
            self.gaps += 1
            logger.warning("engine KV events %d..%d were lost", self.last_sequence + 1, sequence - 1)
        self.last_sequence = sequence
        events = batch[1] if len(batch) > 1 and isinstance(batch[1], list) else []
        with self._lock:
            translated = self.translator.translate(events)
            if translated:
                self._submit(translated)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        self._socket.close(linger=0)
        self._context.term()
