"""The Profiler gRPC API over a real server: Annotate, GetProfile, ListWorkflowTypes, tenants apart."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clairvoyant.contracts.v1 import common_pb2, profiler_pb2, profiler_pb2_grpc
from clairvoyant.core.grpc_errors import ERROR_TRAILER
from clairvoyant.profiler.app import SERVICE_NAME, ProfilerApp
from clairvoyant.profiler.config import ProfilerSettings
from clairvoyant.profiler.persistence import ProfileRepository, ProfileSnapshot
from clairvoyant.stack.natsserver import free_port
from tests.profiler.test_service_records import completion_records, reference_store, small_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
async def stub(tmp_path: Path) -> AsyncIterator[profiler_pb2_grpc.ProfilerStub]:
    """A profiler restored from a database holding acme's "coding" (trained) and "triage" (in
    shadow) profiles; NATS is absent, which must not matter to the API."""
    database_url = f"sqlite:///{tmp_path / 'profiler.db'}"
    records = completion_records("acme", "coding", 60, seed=11) + completion_records("acme", "triage", 3, seed=12)
    store = reference_store(records, small_config())
    repository = ProfileRepository(database_url)
    repository.save(ProfileSnapshot.of(p) for p in store.profiles.values())
    repository.close()
    settings = ProfilerSettings(
        nats_url=f"nats://127.0.0.1:{free_port()}",
        nats_connect_timeout_s=1.0,
        database_url=database_url,
        profiler_port=0,
        metrics_port=0,
    )
    service = ProfilerApp(settings)
    await service.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5
            )
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            yield profiler_pb2_grpc.ProfilerStub(channel)
    finally:
        await service.stop()


def annotate_request(tenant: str, workflow_type_id: str, agent_id: str, workflow_id: str = "new") -> (
    profiler_pb2.AnnotateRequest
):
    return profiler_pb2.AnnotateRequest(
        request_id="r1",
        tenant=tenant,
        app_metadata=common_pb2.AppMetadata(
            workflow_type_id=workflow_type_id, workflow_id=workflow_id, agent_id=agent_id
        ),
        model="m",
        prompt_tokens=100,
    )


async def test_unknown_workflow_is_confidence_none_with_nothing_predicted(
    stub: profiler_pb2_grpc.ProfilerStub,
) -> None:
    for request in (
        annotate_request("acme", "unknown", "planner"),
        profiler_pb2.AnnotateRequest(request_id="r2", tenant="acme"),  # no app_metadata at all
    ):
        reply = await stub.Annotate(request, timeout=5)
        assert reply.annotations == common_pb2.SysAnnotations(confidence=common_pb2.CONFIDENCE_NONE)


async def test_trained_workflow_predicts_the_next_agents(stub: profiler_pb2_grpc.ProfilerStub) -> None:
    planner = (await stub.Annotate(annotate_request("acme", "coding", "planner"), timeout=5)).annotations
    assert planner.confidence in (common_pb2.CONFIDENCE_LOW, common_pb2.CONFIDENCE_HIGH)
    assert [(a.agent_id, a.probability) for a in planner.next_agents] == [("explorer", 1.0)]
    assert planner.predicted_path_regex.startswith("<explorer>{3,4} -> (engineer){3,6} -> reviewer")
    assert planner.HasField("expected_remaining_steps") and planner.expected_remaining_steps > 4
    assert planner.HasField("kairos_rank") and planner.HasField("predicted_output_len")
    verifier = (await stub.Annotate(annotate_request("acme", "coding", "verifier"), timeout=5)).annotations
    # The planner runs first and has the most latency after it: Kairos ranks it behind the verifier.
    assert verifier.kairos_rank < planner.kairos_rank
    assert verifier.predicted_output_len.p50 < planner.predicted_output_len.p50
    shadow = (await stub.Annotate(annotate_request("acme", "triage", "planner"), timeout=5)).annotations
    assert shadow.confidence == common_pb2.CONFIDENCE_SHADOW
    assert shadow.HasField("predicted_output_len") and list(shadow.next_agents) == []


async def test_get_profile_and_its_error_codes(stub: profiler_pb2_grpc.ProfilerStub) -> None:
    profile = await stub.GetProfile(profiler_pb2.GetProfileRequest(tenant="acme", workflow_type_id="coding"))
    assert (profile.tenant, profile.workflow_type_id, profile.instances) == ("acme", "coding", 60)
    assert profile.path_expression.startswith("planner -> <explorer>{3,4}")
    by_agent = {a.agent_id: a for a in profile.agents}
    assert sorted(by_agent) == ["engineer", "explorer", "planner", "reviewer", "verifier"]
    assert by_agent["planner"].samples == 60
    assert by_agent["verifier"].output_len.p50 < by_agent["engineer"].output_len.p50
    assert by_agent["engineer"].mean_service_time_s > by_agent["verifier"].mean_service_time_s
    assert sorted(by_agent, key=lambda a: by_agent[a].kairos_rank)[0] == "verifier"

    for request, code in (
        (profiler_pb2.GetProfileRequest(tenant="acme", workflow_type_id="missing"), grpc.StatusCode.NOT_FOUND),
        (profiler_pb2.GetProfileRequest(tenant="acme"), grpc.StatusCode.INVALID_ARGUMENT),
        (profiler_pb2.GetProfileRequest(workflow_type_id="coding"), grpc.StatusCode.INVALID_ARGUMENT),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetProfile(request, timeout=5)
        assert caught.value.code() == code
        trailers = dict(caught.value.trailing_metadata() or ())
        detail = common_pb2.ErrorDetail.FromString(trailers[ERROR_TRAILER])
        assert detail.code == ("profile_not_found" if code == grpc.StatusCode.NOT_FOUND else "invalid_request")


async def test_list_workflow_types_is_per_tenant(stub: profiler_pb2_grpc.ProfilerStub) -> None:
    listed = await stub.ListWorkflowTypes(profiler_pb2.ListWorkflowTypesRequest(tenant="acme"), timeout=5)
    assert [(w.workflow_type_id, w.instances, w.confidence) for w in listed.workflow_types] == [
        ("coding", 60, listed.workflow_types[0].confidence),
        ("triage", 3, common_pb2.CONFIDENCE_SHADOW),
    ]
    assert all(len(w.agents) == 0 for w in listed.workflow_types)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ListWorkflowTypes(profiler_pb2.ListWorkflowTypesRequest(), timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_tenants_never_see_each_others_profiles(stub: profiler_pb2_grpc.ProfilerStub) -> None:
    own = await stub.Annotate(annotate_request("acme", "coding", "planner"), timeout=5)
    other = await stub.Annotate(annotate_request("globex", "coding", "planner"), timeout=5)
    assert len(own.annotations.next_agents) == 1
    assert other.annotations == common_pb2.SysAnnotations(confidence=common_pb2.CONFIDENCE_NONE)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetProfile(profiler_pb2.GetProfileRequest(tenant="globex", workflow_type_id="coding"), timeout=5)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    listed = await stub.ListWorkflowTypes(profiler_pb2.ListWorkflowTypesRequest(tenant="globex"), timeout=5)
    assert list(listed.workflow_types) == []
