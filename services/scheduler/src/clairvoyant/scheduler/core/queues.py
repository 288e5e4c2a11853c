"""The global queues: one bounded queue per model, ranked by the priority policy.

A model's queue is ordered by priority, then arrival, then submission.  How it is ranked depends
on what the priority policy declares (``clairvoyant.policy.capabilities``):

* neither ``FIXED_PRIORITY`` nor ``INCREMENTAL_PRIORITY``: the whole queue is ranked afresh each
  time (``ranked``);
* ``FIXED_PRIORITY``: a heap per model, keyed once at ``add``;
* ``INCREMENTAL_PRIORITY``: a heap per model whose keys are re-evaluated only for the requests
  submitted since, or named by the policy's ``priority_changes``.

Either heap keeps its keys equal to what a full re-rank would compute.  A queued request's live
heap entry is ``_entries[id]``; any other entry of it is stale and skipped.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Container, Mapping

from clairvoyant.core.errors import InvalidRequest, QueueFull
from clairvoyant.policy.process_table import ChangeFeed, ProgramKey, program_key
from clairvoyant.policy.scheduling import IncrementalPriority, PriorityPolicy
from clairvoyant.policy.types import QueuedRequest

Entry = tuple[float, float, int, QueuedRequest]  # (-priority, arrival time, submission number, request)


class GlobalQueues:
    """Requests waiting for a placement, per model, and the index of them per program.

    Not thread-safe; every call that ranks takes ``now`` and reads no clock.
    """

    def __init__(
        self,
        priority: PriorityPolicy,
        *,
        fixed: bool,
        incremental: IncrementalPriority | None,
        max_per_model: int,
        retry_after_s: float,
    ) -> None:
        """``fixed``: the policy's priorities never change once evaluated.  ``incremental``: the
        policy, when it says which priorities changed (ignored when ``fixed``)."""
        self.priority_policy = priority
        self.max_per_model = max_per_model
        self.retry_after_s = retry_after_s
        # model -> request id -> request; dicts keep submission order, the last tie-break.
        self._queues: dict[str, dict[str, QueuedRequest]] = {}
        self._fixed = fixed
        self._incremental = None if fixed else incremental
        self._heaps: dict[str, list[Entry]] = {}
        self._submitted = 0
        self._entries: dict[str, Entry] = {}
        self._order: dict[str, int] = {}  # queued request id -> submission number (incremental)
        self._to_evaluate: dict[str, dict[str, None]] = {}  # model -> ids, an ordered set
        self._evaluate_all: set[str] = set()  # models whose every queued request is to evaluate
        self._by_program: dict[ProgramKey, dict[str, QueuedRequest]] = {}  # in submission order
        self._feeds: list[ChangeFeed] = []
        # Queues nobody ranks: a model group's, whose calls a model-assigning policy places.
        self.unranked: frozenset[str] = frozenset()

    def check_room(self, request: QueuedRequest) -> None:
        """Raise InvalidRequest when the id is already queued, QueueFull when the model's queue is
        at capacity; otherwise ``add`` will take ``request``."""
        queue = self._queues.get(request.model, {})
        if request.request_id in queue:
            raise InvalidRequest(f"request {request.request_id!r} is already queued", param="request_id")
        if len(queue) >= self.max_per_model:
            raise QueueFull(
                f"the queue for model {request.model!r} is full ({self.max_per_model} requests)",
                retry_after_s=self.retry_after_s,
            )

    def add(self, request: QueuedRequest, now: float) -> None:
        """Queue ``request`` (``check_room`` passed); a fixed priority is evaluated now."""
        queue = self._queues.setdefault(request.model, {})
        queue[request.request_id] = request
        if request.model in self.unranked:
            pass  # a model group's queue: its policy orders it (ASSIGNS_MODELS), nothing is keyed
        elif self._fixed:
            self._submitted += 1
            heap = self._heaps.setdefault(request.model, [])
            entry = (-self.priority_policy.priority(request, now), request.arrival_time, self._submitted, request)
            self._entries[request.request_id] = entry
            heapq.heappush(heap, entry)
            if len(heap) > 2 * len(queue) + 64:  # cancelled requests' entries: drop them
                heap[:] = [e for e in heap if self._entries.get(e[3].request_id) is e]
                heapq.heapify(heap)
        elif self._incremental is not None:
            self._submitted += 1
            self._order[request.request_id] = self._submitted
            self._to_evaluate.setdefault(request.model, {})[request.request_id] = None
        key = program_key(request)
        if key is not None:
            self._by_program.setdefault(key, {})[request.request_id] = request
            for feed in self._feeds:
                feed.add(key)

    def remove(self, request_id: str) -> QueuedRequest | None:
        """Take a waiting request out of its queue; None if it is not queued."""
        queue = next((q for q in self._queues.values() if request_id in q), None)
        if queue is None:
            return None
        request = queue.pop(request_id)
        self._unqueued(request)
        return request

    def remove_unservable(self, model: str, servable: Callable[[QueuedRequest], bool]) -> list[QueuedRequest]:
        """Take out every request of ``model``'s queue that is not ``servable``, in submission order."""
        queue = self._queues.get(model, {})
        removed = [queue.pop(rid) for rid in [rid for rid, r in queue.items() if not servable(r)]]
        for request in removed:
            self._unqueued(request)
        return removed

    # ---- ranking --------------------------------------------------------------------------------

    def ranked(self, model: str, now: float) -> list[Entry]:
        """``model``'s queue as a heap, highest priority first, then earliest arrival, then
        submission; it may hold stale entries, which ``head`` skips.  Popped only as far as
        placements go (usually a few of a long queue), instead of a full sort."""
        if self._fixed:
            return self._heaps.setdefault(model, [])
        if self._incremental is not None:
            return self._rank_incrementally(model, self._queues[model], now)
        priority_of = self.priority_policy.priority
        queue = self._queues[model]
        ranked = [(-priority_of(r, now), r.arrival_time, i, r) for i, r in enumerate(queue.values())]
        heapq.heapify(ranked)
        return ranked

    def head(self, model: str, ranked: list[Entry]) -> Entry | None:
        """The top live entry of ``ranked`` (``model``'s), popping the stale ones above it."""
        queue = self._queues[model]
        # A request cancelled and submitted again (even the same object) or re-keyed has a new entry.
        live = self._entries if self._fixed or self._incremental is not None else None
        while ranked:
            top = ranked[0]
            request = top[3]
            if queue.get(request.request_id) is not request or (
                live is not None and live.get(request.request_id) is not top
            ):
                heapq.heappop(ranked)  # cancelled, re-submitted or re-keyed since: a stale entry
                continue
            return top
        return None

    def pass_over(self, ranked: list[Entry]) -> Entry:
        """Set ``head``'s entry aside: it stays queued, and ``restore`` puts it back."""
        return heapq.heappop(ranked)

    def restore(self, ranked: list[Entry], passed: list[Entry]) -> None:
        """Put the entries ``pass_over`` set aside back in the heap (those placed or removed since
        become stale entries, which ``head`` skips)."""
        for entry in passed:
            heapq.heappush(ranked, entry)

    def take_head(self, model: str, ranked: list[Entry]) -> QueuedRequest:
        """Remove ``head``'s request from the heap and the queue: it is being placed."""
        request = heapq.heappop(ranked)[3]
        del self._queues[model][request.request_id]
        self._unqueued(request)
        return request

    def _rank_incrementally(self, model: str, queue: dict[str, QueuedRequest], now: float) -> list[Entry]:
        """``model``'s heap with every live entry's key equal to the priority at ``now``: asks the
        policy what changed, then evaluates only those requests and the ones submitted since."""
        assert self._incremental is not None
        changes = self._incremental.priority_changes(now)
        if changes.everything:
            self._evaluate_all.update(self._queues)
        for key in changes.programs:
            for rid, held in self._by_program.get(key, {}).items():
                self._to_evaluate.setdefault(held.model, {})[rid] = None
        for rid in changes.requests:
            held_model = next((m for m, q in self._queues.items() if rid in q), None)
            if held_model is not None:
                self._to_evaluate.setdefault(held_model, {})[rid] = None
        heap = self._heaps.setdefault(model, [])
        priority_of = self.priority_policy.priority
        if model in self._evaluate_all:
            self._evaluate_all.discard(model)
            self._to_evaluate.pop(model, None)
            heap[:] = []
            for rid, request in queue.items():
                entry = self._entries[rid] = (-priority_of(request, now), request.arrival_time, self._order[rid], request)
                heap.append(entry)
            heapq.heapify(heap)
            return heap
        for rid in self._to_evaluate.pop(model, {}):
            request = queue[rid]
            negated = -priority_of(request, now)
            keyed = self._entries.get(rid)
            if keyed is None or keyed[0] != negated:
                entry = self._entries[rid] = (negated, request.arrival_time, self._order[rid], request)
                heapq.heappush(heap, entry)
        if len(heap) > 2 * len(queue) + 64:  # re-keyed and placed requests' entries: drop them
            heap[:] = [self._entries[rid] for rid in queue]
            heapq.heapify(heap)
        return heap

    def _unqueued(self, request: QueuedRequest) -> None:
        """``request`` left its queue (placed, cancelled or rejected): forget its ranking state."""
        rid = request.request_id
        key = program_key(request)
        held = self._by_program.get(key) if key is not None else None
        if held is not None:
            held.pop(rid, None)
            if not held:
                del self._by_program[key]  # type: ignore[arg-type]
            for feed in self._feeds:
                feed.add(key)  # type: ignore[arg-type]
        self._entries.pop(rid, None)
        if self._incremental is not None:
            self._order.pop(rid, None)
            self._to_evaluate.get(request.model, {}).pop(rid, None)

    # ---- inspection -----------------------------------------------------------------------------

    def models(self) -> list[str]:
        """The models that have had a queue, in order of their first request."""
        return list(self._queues)

    def requests_by_id(self, model: str) -> Mapping[str, QueuedRequest]:
        """``model``'s waiting requests by id (a live view: do not change it)."""
        return self._queues.get(model, {})

    def depth(self, model: str) -> int:
        return len(self._queues.get(model, ()))

    def requests(self, model: str | None = None) -> list[QueuedRequest]:
        """``model``'s waiting requests (every model's when None), in submission order."""
        queues = self._queues.values() if model is None else [self._queues.get(model, {})]
        return [request for queue in queues for request in queue.values()]

    def is_queued(self, request_id: str) -> bool:
        return any(request_id in q for q in self._queues.values())

    def calls_of(self, key: ProgramKey) -> list[QueuedRequest]:
        """Program ``key``'s waiting calls, in submission order."""
        return list(self._by_program.get(key, {}).values())

    def programs(self) -> list[ProgramKey]:
        """The programs with at least one waiting call."""
        return list(self._by_program)

    def watch_programs(self) -> ChangeFeed:
        """A feed of the programs whose waiting calls change from now on."""
        feed = ChangeFeed()
        self._feeds.append(feed)
        return feed

    def check_integrity(self, placed: Container[str]) -> None:
        """Assert the queues' invariants; ``placed``: the ids holding a placement."""
        for model, queue in self._queues.items():
            assert len(queue) <= self.max_per_model, f"queue {model} over capacity"
            for rid, request in queue.items():
                assert request.model == model and rid not in placed, f"{rid} queued twice"
        by_program = {(k, rid) for k, held in self._by_program.items() for rid in held}
        expected = {(k, r.request_id) for q in self._queues.values() for r in q.values() if (k := program_key(r))}
        assert by_program == expected, "program index drifted"
        if self._fixed:
            queued = {rid for m, q in self._queues.items() if m not in self.unranked for rid in q}
            assert set(self._entries) == queued, "a queued request without its heap entry"
        if self._incremental is not None:
            self._check_incremental()

    def _check_incremental(self) -> None:
        queued = {rid: r for m, q in self._queues.items() if m not in self.unranked for rid, r in q.items()}
        assert set(self._order) == set(queued), "submission numbers drifted"
        assert set(self._entries) <= set(queued), "an entry of a request no longer queued"
        for model, queue in self._queues.items():
            if model in self.unranked:
                continue
            heap_ids = {id(entry) for entry in self._heaps.get(model, ())}
            pending = self._to_evaluate.get(model, {})
            for rid in queue:
                if model in self._evaluate_all or rid in pending:
                    continue
                assert id(self._entries[rid]) in heap_ids, f"{rid}: neither ranked nor to evaluate"
