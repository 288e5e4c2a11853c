"""Cache directives at the worker's edge: proto ``CacheDirective`` -> core ``Directive``, checked as
a batch and applied on the engine thread; and their NATS subject, ``cv.cache.directives.<worker_id>``.

Contract of ``apply_directives``: every directive of the batch is decoded and checked before any is
applied, so a batch refused with ``DirectiveRejected`` changed nothing.  A directive's tenant is
its lineage's, "" meaning "default" (as ``Generate`` files requests), and it only ever touches
that tenant's blocks.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from google.protobuf.message import DecodeError
from nats.aio.msg import Msg

from clairvoyant.contracts.v1 import cachemgr_pb2, worker_pb2
from clairvoyant.core.bus import EventBus
from clairvoyant.worker.core.engine import LLMEngine
from clairvoyant.worker.core.tiers import Directive, DirectiveError, DirectiveKind
from clairvoyant.worker.core.types import Tier
from clairvoyant.worker.engine_loop import AsyncEngine
from clairvoyant.worker.kv_events import subject_token
from clairvoyant.worker.metrics import DIRECTIVE_MESSAGES_INVALID, DIRECTIVES

logger = logging.getLogger(__name__)

DIRECTIVES_PREFIX = "cv.cache.directives"
_KINDS: dict[int, DirectiveKind] = {
    cachemgr_pb2.DIRECTIVE_KIND_DROP: "drop",
    cachemgr_pb2.DIRECTIVE_KIND_RETAIN: "retain",
    cachemgr_pb2.DIRECTIVE_KIND_WRITE_BACK: "write_back",
    cachemgr_pb2.DIRECTIVE_KIND_PROMOTE: "promote",
    cachemgr_pb2.DIRECTIVE_KIND_PRE_PREFILL: "pre_prefill",
}
_TIERS: dict[int, Tier | None] = {
    cachemgr_pb2.CACHE_TIER_UNSPECIFIED: None,
    cachemgr_pb2.CACHE_TIER_L1: 1,
    cachemgr_pb2.CACHE_TIER_L2: 2,
    cachemgr_pb2.CACHE_TIER_L3: 3,
}
_MAX_HASH = (1 << 64) - 1


def directives_subject(worker_id: str) -> str:
    return f"{DIRECTIVES_PREFIX}.{subject_token(worker_id)}"


class DirectiveRejected(Exception):
    """The batch was refused because of directive ``index``; nothing was applied.
    ``missing_tier``: the directive needs a KV tier this worker does not have."""

    def __init__(self, index: int, reason: str, *, missing_tier: bool = False) -> None:
        super().__init__(f"directive {index}: {reason}")
        self.index = index
        self.missing_tier = missing_tier


def _block_hash(text: str) -> int:
    """A block hash as the wire writes it: decimal, or hexadecimal with ``0x``."""
    value = int(text, 0)
    if not 0 <= value <= _MAX_HASH:
        raise ValueError(text)
    return value


def decode_directive(msg: cachemgr_pb2.CacheDirective, index: int, worker_id: str) -> Directive:
    """The core's directive for ``msg``; raises ``DirectiveRejected`` for one that is malformed or
    addressed to another worker."""
    kind = _KINDS.get(msg.kind)
    if kind is None:
        raise DirectiveRejected(index, "the directive kind is unspecified")
    if msg.worker_id and msg.worker_id != worker_id:
        raise DirectiveRejected(index, f"addressed to worker {msg.worker_id!r}, this is {worker_id!r}")
    try:
        hashes = tuple(_block_hash(text) for text in msg.block_hashes)
    except ValueError:
        raise DirectiveRejected(index, "block hashes are 64-bit integers, decimal or 0x-hexadecimal") from None
    if msg.target_tier not in _TIERS:
        raise DirectiveRejected(index, f"unknown target tier {msg.target_tier}")
    lineage = msg.lineage
    return Directive(
        kind=kind,
        namespace=lineage.tenant or "default",
        workflow_id=lineage.workflow_id or None,
        agent_id=lineage.agent_id or None,
        request_id=lineage.request_id or None,
        block_hashes=hashes,
        ttl_s=msg.ttl_s if msg.HasField("ttl_s") else None,
        target_tier=_TIERS[msg.target_tier],
        token_ids=tuple(msg.token_ids),
    )


def apply_batch(engine: LLMEngine, directives: Sequence[Directive]) -> int:
    """Check every directive, then apply them all (engine thread); returns how many were applied."""
    for index, directive in enumerate(directives):
        try:
            engine.check_directive(directive)
        except DirectiveError as exc:
            raise DirectiveRejected(index, str(exc), missing_tier=exc.missing_tier) from exc
    for index, directive in enumerate(directives):
        try:
            engine.apply_directive(directive)
        except DirectiveError as exc:  # the checks above missed a rule: say how far it got
            raise DirectiveRejected(index, f"{exc} (the {index} before it were applied)") from exc
    return len(directives)


async def apply_directives(
    engine: AsyncEngine, messages: Sequence[cachemgr_pb2.CacheDirective], worker_id: str
) -> int:
    """Decode, check and apply a batch; raises ``DirectiveRejected`` (nothing applied)."""
    directives = [decode_directive(msg, index, worker_id) for index, msg in enumerate(messages)]
    return await engine.call(lambda core: apply_batch(core, directives))


class DirectiveSubscriber:
    """Takes ``ApplyDirectivesRequest``s on the worker's directives subject; answers a message
    with a reply subject with an ``ApplyDirectivesResponse`` (``applied`` 0 when refused).
    Malformed messages are counted and dropped.  ``apply`` checks and applies one batch (a
    frontend's ``apply_directives``), raising ``DirectiveRejected``."""

    def __init__(
        self, apply: Callable[[Sequence[cachemgr_pb2.CacheDirective]], Awaitable[int]], worker_id: str
    ) -> None:
        self.apply = apply
        self.worker_id = worker_id
        self.subject = directives_subject(worker_id)

    async def subscribe(self, bus: EventBus) -> None:
        await bus.subscribe(self.subject, self.handle)

    async def handle(self, msg: Msg) -> None:
        try:
            request = worker_pb2.ApplyDirectivesRequest.FromString(msg.data)
        except DecodeError:
            DIRECTIVE_MESSAGES_INVALID.inc()
            logger.warning("dropped a malformed directive message on %s", msg.subject)
            return
        applied = 0
        try:
            applied = await self.apply(request.directives)
            DIRECTIVES.labels("nats", "applied").inc()
        except DirectiveRejected as exc:
            DIRECTIVES.labels("nats", "rejected").inc()
            logger.warning("refused a directive batch from NATS: %s", exc)
        except Exception:  # never let one message take the subscription down
            DIRECTIVES.labels("nats", "failed").inc()
            logger.exception("directive batch from NATS failed")
        if msg.reply:
            await msg.respond(worker_pb2.ApplyDirectivesResponse(applied=applied).SerializeToString())
