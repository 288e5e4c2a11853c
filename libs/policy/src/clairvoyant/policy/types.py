"""Value objects the scheduler core works on.  Plain, typed and immutable: policies may keep them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from clairvoyant.core.annotations import SysAnnotations
from clairvoyant.core.app_metadata import AppMetadata


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """One request waiting for (or holding) a placement."""

    request_id: str
    tenant: str
    model: str
    arrival_time: float  # on the core's time scale (monotonic seconds), set when submitted
    prompt_tokens: int = 0  # an estimate; the worker tokenizes exactly
    max_tokens: int = 0
    app_metadata: AppMetadata | None = None  # None: the application sent no workflow ids
    annotations: SysAnnotations | None = None  # the profiler's predictions; None: un-annotated
    exclude_workers: frozenset[str] = field(default_factory=frozenset)
    owner: str = ""  # who will use and release the placement (its lease's owner)
    # The prompt's chained block hashes (clairvoyant.core.blockhash, 16-token blocks); empty when
    # the caller did not send them (the gateway has text, not token ids).
    prompt_block_hashes: tuple[int, ...] = ()
    # The workflow's input as the application posed it (the text a configuration router reads,
    # Aragog §3.1); sent for calls of a model group, "" otherwise.
    input_text: str = ""


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """What a worker says about itself in a heartbeat (the subset of WorkerStats the scheduler uses)."""

    worker_id: str
    model: str
    address: str  # host:port of the worker's gRPC server
    max_batch: int
    http_address: str = ""
    running: int = 0
    queued: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    max_model_len: int = 0
    draining: bool = False  # the worker itself is shutting down
    heartbeat_interval_s: float = 0.0  # 0: unknown, the core's default applies
    preemptions_total: int = 0  # cumulative, since the worker started
    block_size: int = 0  # tokens per KV block; 0 = not reported
    # The requests the worker holds (Generate calls in progress); None: it does not say.
    held_requests: frozenset[str] | None = None
    # A decode step costs decode_base_s + decode_per_seq_s × batch seconds; both 0: not known.
    decode_base_s: float = 0.0
    decode_per_seq_s: float = 0.0


@dataclass(frozen=True, slots=True)
class WorkerView:
    """A worker as routing policies see it: its last report plus the scheduler's own accounting."""

    worker_id: str
    model: str
    address: str
    http_address: str
    running: int  # reported by the worker
    queued: int  # reported by the worker (its local queue)
    placed: int  # placements this scheduler handed out and that are not yet completed
    max_batch: int
    kv_blocks_used: int
    kv_blocks_total: int
    max_model_len: int
    draining: bool  # drained by an operator / the autoscaler, or the worker says it is draining
    last_heartbeat: float  # core time of the last report
    heartbeat_interval_s: float
    # Placements this scheduler may hold on the worker; 0 = max_batch.  Above max_batch only for
    # presets whose calls queue at the engine (its local scheduler orders and preempts them).
    admission_limit: int = 0
    block_size: int = 0  # tokens per KV block as the worker reports it; 0 = not reported

    @property
    def has_room(self) -> bool:
        return self.placed < (self.admission_limit or self.max_batch)

    def with_placed(self, placed: int) -> WorkerView:
        """A copy with another placement count: ``dataclasses.replace`` without its per-call field
        introspection, which dominated a dispatch that places many calls at once.  Lists every
        field: a new one must be added here (a test compares it with ``replace``)."""
        return WorkerView(
            self.worker_id, self.model, self.address, self.http_address, self.running, self.queued, placed,
            self.max_batch, self.kv_blocks_used, self.kv_blocks_total, self.max_model_len, self.draining,
            self.last_heartbeat, self.heartbeat_interval_s, self.admission_limit, self.block_size,
        )  # fmt: skip

    @property
    def kv_usage(self) -> float:
        """Fraction of the L1 KV pool in use; 0 when the worker reports no pool."""
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


class Decision(NamedTuple):
    """One placement made by ``GlobalScheduler.dispatch``."""

    request_id: str
    worker: WorkerView  # the worker as it was right after this placement was counted
    base_priority: float  # the priority the request was ranked with; larger = more urgent
    queue_wait_s: float  # time from submit to this placement
    # The worker holding the KV of the request's session, to move to ``worker`` before the call
    # runs there (a ``MigratesKv`` routing policy's answer: SAGA's stolen sessions); None: no move.
    kv_source: str | None = None
    # The request's program as the process table had it at this placement: its completed calls'
    # waiting and service time (0 without a program).  Placements carry them to the engine rules.
    program_wait_s: float = 0.0
    program_service_s: float = 0.0
    # The engine's seat limit to send with the placement (the worker's knee, when the routing policy
    # admits at the knee and displaces: ``Admitting.displaces``); 0: none.
    seat_limit: int = 0

    @property
    def worker_id(self) -> str:
        return self.worker.worker_id


class Completion(NamedTuple):
    """A placement that ended, as the process table learns it (``GlobalScheduler.complete``)."""

    request: QueuedRequest
    worker_id: str
    dispatch_time: float  # core time of the placement
    finish_time: float  # core time the completion was reported
    # Model execution time of the call (seconds the engine spent computing it).  When the caller
    # cannot measure it (the live Complete RPC), finish_time - dispatch_time stands in: an
    # over-estimate by the call's engine-side queueing.
    service_s: float
    output_tokens: int = 0  # 0 when unknown


class ExpiredWorker(NamedTuple):
    """A worker removed by ``GlobalScheduler.expire_workers`` and what its loss did."""

    worker_id: str
    model: str
    failed_request_ids: tuple[str, ...]  # placements it held: the callers must fail or retry them
    rejected_request_ids: tuple[str, ...]  # queued requests left with no worker at all (NoWorkers)


class QueueState(NamedTuple):
    model: str
    depth: int
    capacity: int


class SchedulerSnapshot(NamedTuple):
    policy: str
    taken_at: float  # core time; a worker's heartbeat age is taken_at - last_heartbeat
    queues: tuple[QueueState, ...]
    workers: tuple[WorkerView, ...]  # ordered by worker id
