"""The gRPC CacheManager servicer: a read-only adapter over the in-memory core.

Every RPC answers from memory on the event loop (the NATS handlers change the core on the same
loop, so no locks), and none waits on NATS: Stats and Plan keep answering while the bus is down.
"""

from __future__ import annotations

import grpc

from clairvoyant.cachemgr import convert
from clairvoyant.cachemgr.core import CacheManagerCore
from clairvoyant.contracts.v1 import cachemgr_pb2, cachemgr_pb2_grpc

HINTS_UNSUPPORTED = (
    "the cache manager takes its hints from completion records (cv.requests.completed), which carry "
    "the annotations each request was served with; Hint is not served"
)


class CacheManagerServicer(cachemgr_pb2_grpc.CacheManagerServicer):
    def __init__(self, core: CacheManagerCore) -> None:
        self.core = core

    async def Stats(
        self, request: cachemgr_pb2.CacheStatsRequest, context: grpc.aio.ServicerContext
    ) -> cachemgr_pb2.CacheStats:
        return convert.cache_stats(self.core.stats())

    async def Plan(
        self, request: cachemgr_pb2.PlanRequest, context: grpc.aio.ServicerContext
    ) -> cachemgr_pb2.CachePlan:
        """The most recent directives issued (bounded by the core), for one worker or all."""
        return cachemgr_pb2.CachePlan(
            directives=[convert.directive(item) for item in self.core.plan(request.worker_id)]
        )

    async def Hint(
        self, request: cachemgr_pb2.HintRequest, context: grpc.aio.ServicerContext
    ) -> cachemgr_pb2.HintResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, HINTS_UNSUPPORTED)
        raise AssertionError("abort raises")
