"""The gRPC Profiler servicer: a thin, read-only adapter over the in-memory ProfileStore.

Every RPC answers from memory on the event loop (the consumer changes the store on the same loop,
so no locks); nothing here touches the database.  Profiles are keyed by (tenant, workflow type)
and every lookup takes the caller's tenant, so one tenant never sees another's profiles.
"""

from __future__ import annotations

import logging
import time

import grpc

from clairvoyant.contracts.v1 import common_pb2, profiler_pb2, profiler_pb2_grpc
from clairvoyant.core.errors import ClairvoyantError, InvalidRequest
from clairvoyant.core.grpc_errors import abort
from clairvoyant.profiler import convert
from clairvoyant.profiler import metrics as m
from clairvoyant.profiler.core import Annotation, ProfileStore

logger = logging.getLogger(__name__)


class ProfileNotFound(ClairvoyantError):
    http_status = 404
    error_type = "not_found_error"
    default_code = "profile_not_found"


class ProfilerServicer(profiler_pb2_grpc.ProfilerServicer):
    def __init__(self, store: ProfileStore) -> None:
        self.store = store

    async def Annotate(
        self, request: profiler_pb2.AnnotateRequest, context: grpc.aio.ServicerContext
    ) -> profiler_pb2.AnnotateResponse:
        started = time.perf_counter()
        annotations = convert.sys_annotations(self.annotate(request))
        m.ANNOTATIONS.labels(common_pb2.Confidence.Name(annotations.confidence)).inc()
        m.ANNOTATE_SECONDS.observe(time.perf_counter() - started)
        return profiler_pb2.AnnotateResponse(annotations=annotations)

    def annotate(self, request: profiler_pb2.AnnotateRequest) -> Annotation:
        """Never fails: a request the profiler cannot place gets confidence NONE (the reactive tier)."""
        meta = request.app_metadata
        if not (meta.workflow_type_id and meta.agent_id):
            return Annotation.empty()
        try:
            return self.store.annotate(
                request.tenant,
                meta.workflow_type_id,
                meta.agent_id,
                workflow_id=meta.workflow_id or None,
                prompt_tokens=request.prompt_tokens or None,
                now=request.arrival_time or time.time(),
                model=request.model or None,
            )
        except Exception:  # a prediction bug must not fail the request it was meant to help
            logger.exception("annotating %s failed", request.request_id)
            return Annotation.empty()

    async def GetProfile(
        self, request: profiler_pb2.GetProfileRequest, context: grpc.aio.ServicerContext
    ) -> profiler_pb2.WorkflowProfile:
        try:
            for name in ("tenant", "workflow_type_id"):
                if not getattr(request, name):
                    raise InvalidRequest(f"{name} is required", param=name)
            profile = self.store.profiles.get((request.tenant, request.workflow_type_id))
            if profile is None:
                raise ProfileNotFound(
                    f"no profile of workflow type {request.workflow_type_id!r} for this tenant",
                    param="workflow_type_id",
                )
        except ClairvoyantError as err:
            await abort(context, err)
        return convert.workflow_profile(profile)

    async def ListWorkflowTypes(
        self, request: profiler_pb2.ListWorkflowTypesRequest, context: grpc.aio.ServicerContext
    ) -> profiler_pb2.ListWorkflowTypesResponse:
        if not request.tenant:
            await abort(context, InvalidRequest("tenant is required", param="tenant"))
        profiles = sorted(
            (p for (tenant, _), p in self.store.profiles.items() if tenant == request.tenant),
            key=lambda p: p.workflow_type_id,
        )
        return profiler_pb2.ListWorkflowTypesResponse(
            workflow_types=[convert.workflow_profile(p, agents=False) for p in profiles]
        )
