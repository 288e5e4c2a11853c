"""The actuators: real worker processes for the local one; for Docker and Kubernetes, the exact
requests their client libraries send, recorded by a small HTTP server standing in for the engine
or the API server (none runs here).  A test that needs a real Docker engine skips without one.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import docker
import nats
import pytest
from kubernetes import client as k8s

from clairvoyant.autoscaler.actuators import (
    ACTUATORS,
    ActuatorError,
    DockerActuator,
    KubernetesActuator,
    LocalActuator,
    is_pending,
)
from clairvoyant.autoscaler.actuators.base import model_slug
from clairvoyant.contracts.v1 import worker_pb2
from clairvoyant.core.bus import worker_stats_subject
from clairvoyant.core.healthcheck import grpc_health_serving
from clairvoyant.core.registry import Registry
from clairvoyant.stack.natsserver import can_bind
from tests.autoscaler.conftest import Answer, Recorded, RecordingServer, unreachable_url
from tests.conftest import docker_available

MODEL = "llama-3.1-8b"  # an emulated model: no weights, starts in seconds
SLUG = "llama-3-1-8b"
NAMESPACE = "serving"
DEPLOYMENT = f"cv-worker-{SLUG}"
SCALE_PATH = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{DEPLOYMENT}/scale"
PODS_PATH = f"/api/v1/namespaces/{NAMESPACE}/pods"
DOCKER_API = "/v1.45"


# --- the registry ---------------------------------------------------------------------------------


@pytest.mark.unit
def test_every_platform_is_registered_under_its_own_name() -> None:
    assert ACTUATORS.names() == ["docker", "kubernetes", "local"]
    for name in ACTUATORS:
        assert ACTUATORS.factory(name).name == name  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="already registered"):
        ACTUATORS.register("local")(LocalActuator)
    with pytest.raises(ValueError, match="choose one of: docker, kubernetes, local"):
        ACTUATORS.create("ssh")
    assert isinstance(ACTUATORS, Registry)


@pytest.mark.unit
def test_replica_names_use_a_dns_safe_slug_of_the_model() -> None:
    assert model_slug("llama-3.1-8b") == "llama-3-1-8b"
    assert model_slug("Qwen/Qwen2.5-7B-Instruct") == "qwen-qwen2-5-7b-instruct"
    assert model_slug("/models/tiny.gguf") == "models-tiny-gguf"
    with pytest.raises(ValueError):
        model_slug("..")
    assert KubernetesActuator(deployment_template="w-{model}").deployment_name("Qwen2.5-7B") == "w-qwen2-5-7b"


# --- local: real worker processes -----------------------------------------------------------------


def local_actuator(tmp_path: Path, nats_url: str, **options: Any) -> LocalActuator:
    environment = {"CV_NATS_URL": nats_url, "CV_RUNNER": "emulated", "CV_GPU": "H100-80G",
                   "CV_TORCH_THREADS": "1", "CV_LOG_LEVEL": "WARNING", "CV_HEARTBEAT_INTERVAL_S": "0.2"}
    return LocalActuator(environment=environment, var_dir=tmp_path / "var", prefix="t", **options)


async def wait_serving(address: str, timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await asyncio.to_thread(grpc_health_serving, address, 1.0):
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{address} did not report SERVING within {timeout_s} s")
        await asyncio.sleep(0.2)


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.integration
@pytest.mark.timeout(180)
async def test_local_worker_comes_up_under_its_id_and_release_stops_it(tmp_path: Path, nats_url: str) -> None:
    actuator = local_actuator(tmp_path, nats_url, model_environment={MODEL: {"CV_MAX_NUM_SEQS": "7"}})
    bus = await nats.connect(nats_url)
    try:
        worker_id = await actuator.provision(MODEL)
        assert worker_id == f"t-{SLUG}-1"
        heartbeats = await bus.subscribe(worker_stats_subject(worker_id))
        replica = actuator.replicas[worker_id]
        assert await actuator.running() == {worker_id: MODEL}  # launched, not ready yet

        await wait_serving(f"127.0.0.1:{replica.grpc_port}", 120)
        stats = worker_pb2.WorkerStats.FromString((await heartbeats.next_msg(timeout=30)).data)
        assert (stats.worker_id, stats.model) == (worker_id, MODEL)
        assert stats.grpc_address == f"127.0.0.1:{replica.grpc_port}"
        assert stats.max_batch == 7  # the per-model environment reached the worker
        assert replica.log_path == tmp_path / "var" / "logs" / f"{worker_id}.log" and replica.log_path.exists()

        await actuator.release(worker_id, MODEL)
        assert replica.process.returncode == 0  # SIGTERM: the worker stopped cleanly
        assert not process_exists(replica.process.pid)
        assert can_bind("127.0.0.1", replica.grpc_port) and can_bind("127.0.0.1", replica.http_port)
        assert await actuator.running() == {} and actuator.replicas == {}
        await heartbeats.unsubscribe()

        await actuator.release(worker_id, MODEL)  # again: nothing to do
        await actuator.release("t-nobody-9", MODEL)  # never started: nothing to do
        assert await actuator.provision(MODEL) == f"t-{SLUG}-2"  # ids are never reused
    finally:
        await actuator.close()
        await bus.close()
    assert await actuator.running() == {}


@pytest.mark.integration
@pytest.mark.timeout(120)
async def test_local_close_stops_every_worker(tmp_path: Path, nats_url: str) -> None:
    actuator = local_actuator(tmp_path, nats_url)
    first = await actuator.provision(MODEL)
    second = await actuator.provision("qwen2.5-7b")
    assert await actuator.running() == {first: MODEL, second: "qwen2.5-7b"}
    processes = [r.process for r in actuator.replicas.values()]
    await wait_serving(f"127.0.0.1:{actuator.replicas[second].grpc_port}", 90)

    await actuator.close()
    assert all(p.returncode is not None and not process_exists(p.pid) for p in processes)
    assert await actuator.running() == {}


@pytest.mark.integration
async def test_local_worker_that_exits_leaves_running(tmp_path: Path, nats_url: str) -> None:
    actuator = local_actuator(tmp_path, nats_url, model_environment={"no-such-model": {}})
    worker_id = await actuator.provision("no-such-model")  # launched; the worker then fails to load it
    await asyncio.wait_for(actuator.replicas[worker_id].process.wait(), 60)
    assert actuator.replicas[worker_id].process.returncode != 0
    assert await actuator.running() == {}
    assert "no-such-model" in actuator.replicas[worker_id].log_path.read_text()
    await actuator.release(worker_id, "no-such-model")
    assert actuator.replicas == {}


AUTOSCALER_SCRIPT = """
import asyncio, sys
from pathlib import Path
from clairvoyant.autoscaler.actuators import LocalActuator

async def main():
    actuator = LocalActuator(environment={"CV_NATS_URL": sys.argv[1], "CV_RUNNER": "emulated"},
                             var_dir=Path(sys.argv[2]))
    await actuator.provision("llama-3.1-8b")
    print(next(iter(actuator.replicas.values())).process.pid, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def process_alive(pid: int) -> bool:
    """Running, not a zombie (whose parent died before reaping it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="die-with-parent is Linux-only (prctl)")
async def test_local_workers_die_with_the_autoscaler(tmp_path: Path, nats_url: str) -> None:
    autoscaler = await asyncio.create_subprocess_exec(
        sys.executable, "-c", AUTOSCALER_SCRIPT, nats_url, str(tmp_path / "var"), stdout=asyncio.subprocess.PIPE)
    try:
        assert autoscaler.stdout is not None
        worker_pid = int(await asyncio.wait_for(autoscaler.stdout.readline(), 60))
        assert process_alive(worker_pid)
    finally:
        autoscaler.kill()  # SIGKILL: it stops nothing itself
        await autoscaler.wait()
    for _ in range(100):
        if not process_alive(worker_pid):
            break
        await asyncio.sleep(0.1)
    assert not process_alive(worker_pid)


@pytest.mark.unit
async def test_local_launch_failure_is_an_actuator_error(tmp_path: Path) -> None:
    (tmp_path / "var").write_text("a file where the log directory should be")
    actuator = LocalActuator(var_dir=tmp_path / "var")
    with pytest.raises(ActuatorError, match=f"cannot start worker local-{SLUG}-1 \\(llama-3.1-8b\\)"):
        await actuator.provision(MODEL)
    assert await actuator.running() == {}


# --- kubernetes: the requests sent to the API server ----------------------------------------------


def scale_answer(replicas: int) -> dict[str, Any]:
    return {"apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE},
            "spec": {"replicas": replicas}, "status": {"replicas": replicas}}


def pod(name: str, model: str = MODEL, phase: str = "Running", deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": NAMESPACE,
                                "labels": {"app.kubernetes.io/name": "clairvoyant-worker", "clairvoyant.model": model}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "status": {"phase": phase}}


def serve_scale(server: RecordingServer, replicas: int) -> None:
    """The Deployment's scale subresource, as the API server keeps it: PATCH changes what GET reads."""
    current = {"replicas": replicas}

    def patch(request: Recorded) -> Answer:
        current["replicas"] = request.body["spec"]["replicas"]
        return 200, scale_answer(current["replicas"])

    server.routes[("GET", SCALE_PATH)] = lambda _: (200, scale_answer(current["replicas"]))
    server.routes[("PATCH", SCALE_PATH)] = patch


def kubernetes_actuator(url: str) -> KubernetesActuator:
    return KubernetesActuator(namespace=NAMESPACE, api_client=k8s.ApiClient(k8s.Configuration(host=url)))


@pytest.mark.integration
async def test_kubernetes_provision_patches_the_scale_up_by_one(api_server: RecordingServer) -> None:
    serve_scale(api_server, 2)
    actuator = kubernetes_actuator(api_server.url)
    assert await actuator.provision(MODEL) == f"pending:{MODEL}:1"
    assert await actuator.provision(MODEL) == f"pending:{MODEL}:2"
    assert api_server.calls() == [("GET", SCALE_PATH), ("PATCH", SCALE_PATH)] * 2
    patches = [r for r in api_server.requests if r.method == "PATCH"]
    assert [r.body for r in patches] == [{"spec": {"replicas": 3}}, {"spec": {"replicas": 4}}]
    assert {r.content_type for r in patches} == {"application/strategic-merge-patch+json"}


@pytest.mark.integration
async def test_kubernetes_concurrent_provisions_each_add_one(api_server: RecordingServer) -> None:
    serve_scale(api_server, 0)
    actuator = kubernetes_actuator(api_server.url)
    ids = await asyncio.gather(*(actuator.provision(MODEL) for _ in range(5)))
    assert sorted(ids) == [f"pending:{MODEL}:{n}" for n in range(1, 6)] and all(map(is_pending, ids))
    assert [r.body["spec"]["replicas"] for r in api_server.requests if r.method == "PATCH"] == [1, 2, 3, 4, 5]


@pytest.mark.integration
async def test_kubernetes_release_marks_that_pod_then_scales_down(api_server: RecordingServer) -> None:
    serve_scale(api_server, 3)
    name = f"{DEPLOYMENT}-7d9f8-abcde"
    api_server.routes[("GET", f"{PODS_PATH}/{name}")] = (200, pod(name))
    api_server.routes[("PATCH", f"{PODS_PATH}/{name}")] = (200, pod(name))
    api_server.routes[("DELETE", f"{PODS_PATH}/{name}")] = (200, pod(name, deleting=True))
    actuator = kubernetes_actuator(api_server.url)

    await actuator.release(name, MODEL)
    assert api_server.calls() == [("GET", f"{PODS_PATH}/{name}"), ("PATCH", f"{PODS_PATH}/{name}"),
                                  ("GET", SCALE_PATH), ("PATCH", SCALE_PATH), ("DELETE", f"{PODS_PATH}/{name}")]
    annotate, scale = api_server.requests[1], api_server.requests[3]
    assert annotate.body == {"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "-1000"}}}
    assert scale.body == {"spec": {"replicas": 2}}

    await actuator.release(name, MODEL)  # again: it must not remove a second pod
    assert len(api_server.requests) == 5


@pytest.mark.integration
async def test_kubernetes_release_is_done_when_the_replicaset_removed_the_pod_first(api_server: RecordingServer) -> None:
    """Scaling down made the ReplicaSet delete the marked pod before our own delete: a 404 there
    is the release done, not an error."""
    serve_scale(api_server, 2)
    api_server.routes[("GET", f"{PODS_PATH}/p")] = (200, pod("p"))
    api_server.routes[("PATCH", f"{PODS_PATH}/p")] = (200, pod("p"))
    api_server.routes[("DELETE", f"{PODS_PATH}/p")] = (404, {"kind": "Status", "message": "pods \"p\" not found"})
    await kubernetes_actuator(api_server.url).release("p", MODEL)
    assert api_server.calls()[-1] == ("DELETE", f"{PODS_PATH}/p")
    assert [r.body for r in api_server.requests if r.path == SCALE_PATH and r.method == "PATCH"] == [
        {"spec": {"replicas": 1}}]


@pytest.mark.integration
async def test_kubernetes_concurrent_releases_of_one_pod_scale_down_once(api_server: RecordingServer) -> None:
    serve_scale(api_server, 3)
    api_server.routes[("GET", f"{PODS_PATH}/p")] = (200, pod("p"))
    api_server.routes[("PATCH", f"{PODS_PATH}/p")] = (200, pod("p"))
    api_server.routes[("DELETE", f"{PODS_PATH}/p")] = (200, pod("p", deleting=True))
    actuator = kubernetes_actuator(api_server.url)
    await asyncio.gather(*(actuator.release("p", MODEL) for _ in range(3)))
    assert [r.body for r in api_server.requests if r.path == SCALE_PATH and r.method == "PATCH"] == [
        {"spec": {"replicas": 2}}]


@pytest.mark.integration
async def test_kubernetes_release_that_failed_is_done_by_the_retry(api_server: RecordingServer) -> None:
    serve_scale(api_server, 3)
    api_server.routes[("GET", f"{PODS_PATH}/p")] = (200, pod("p"))
    api_server.routes[("PATCH", f"{PODS_PATH}/p")] = (503, {"kind": "Status", "message": "try again"})
    actuator = kubernetes_actuator(api_server.url)
    with pytest.raises(ActuatorError, match="cannot mark pod p for removal in namespace serving: 503"):
        await actuator.release("p", MODEL)
    assert ("PATCH", SCALE_PATH) not in api_server.calls()
    api_server.routes[("PATCH", f"{PODS_PATH}/p")] = (200, pod("p"))
    api_server.routes[("DELETE", f"{PODS_PATH}/p")] = (200, pod("p", deleting=True))
    await actuator.release("p", MODEL)
    assert [r.body for r in api_server.requests if r.path == SCALE_PATH and r.method == "PATCH"] == [
        {"spec": {"replicas": 2}}]
    assert api_server.calls()[-1] == ("DELETE", f"{PODS_PATH}/p")


@pytest.mark.integration
@pytest.mark.parametrize("answer", [(404, None), (200, pod("p", deleting=True)), (200, pod("p", model="qwen2.5-7b"))],
                         ids=["gone", "terminating", "another-model"])
async def test_kubernetes_release_of_a_pod_gone_or_not_its_own_scales_nothing(
    api_server: RecordingServer, answer: Answer
) -> None:
    serve_scale(api_server, 3)
    api_server.routes[("GET", f"{PODS_PATH}/p")] = answer
    await kubernetes_actuator(api_server.url).release("p", MODEL)
    assert api_server.calls() == [("GET", f"{PODS_PATH}/p")]


@pytest.mark.integration
async def test_kubernetes_release_of_a_pending_replica_scales_down_once(api_server: RecordingServer) -> None:
    serve_scale(api_server, 1)
    actuator = kubernetes_actuator(api_server.url)
    replica_id = await actuator.provision(MODEL)
    await actuator.release(replica_id, MODEL)
    await actuator.release(replica_id, MODEL)
    assert [r.body for r in api_server.requests if r.method == "PATCH"] == [{"spec": {"replicas": 2}},
                                                                            {"spec": {"replicas": 1}}]
    serve_scale(api_server, 0)
    await actuator.release(await actuator.provision(MODEL), MODEL)
    await actuator.release(f"pending:{MODEL}:99", MODEL)  # never below zero
    assert [r.body["spec"]["replicas"] for r in api_server.requests if r.method == "PATCH"][-3:] == [1, 0, 0]


@pytest.mark.integration
async def test_kubernetes_running_lists_live_worker_pods(api_server: RecordingServer) -> None:
    pods = [pod("a"), pod("b", model="qwen2.5-7b", phase="Pending"), pod("c", deleting=True), pod("d", phase="Failed")]
    api_server.routes[("GET", PODS_PATH)] = (200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": pods})
    actuator = kubernetes_actuator(api_server.url)
    assert await actuator.running() == {"a": MODEL, "b": "qwen2.5-7b"}
    assert api_server.requests[0].query == {"labelSelector": ["app.kubernetes.io/name=clairvoyant-worker"]}
    await actuator.close()
    assert len(api_server.requests) == 1  # close leaves the pods to the cluster


@pytest.mark.integration
async def test_kubernetes_failures_are_actuator_errors(api_server: RecordingServer) -> None:
    serve_scale(api_server, 1)
    forbidden = {"kind": "Status", "code": 403, "reason": "Forbidden",
                 "message": 'deployments.apps "cv-worker-llama-3-1-8b" is forbidden: cannot patch resource "deployments/scale"'}
    api_server.routes[("PATCH", SCALE_PATH)] = (403, forbidden)
    actuator = kubernetes_actuator(api_server.url)
    with pytest.raises(ActuatorError) as raised:
        await actuator.provision(MODEL)
    assert str(raised.value) == (
        f"kubernetes: cannot scale deployment {DEPLOYMENT} to 2 in namespace {NAMESPACE}: 403 Forbidden: "
        f"{forbidden['message']}"
    )
    with pytest.raises(ActuatorError, match="cannot list worker pods in namespace serving: "):
        await kubernetes_actuator(unreachable_url()).running()
    api_server.routes[("GET", f"{PODS_PATH}/p")] = (500, {"kind": "Status", "message": "etcd timeout"})
    with pytest.raises(ActuatorError, match="cannot read pod p in namespace serving: 500 .*etcd timeout"):
        await actuator.release("p", MODEL)


# --- docker: the requests sent to the engine ------------------------------------------------------


CONTAINER_ID = "c0ffee"


def container(name: str, owner: str = "cv-worker", model: str = MODEL) -> dict[str, Any]:
    labels = {"clairvoyant.model": model, "clairvoyant.replica": name, "clairvoyant.owner": owner}
    return {"Id": CONTAINER_ID, "Name": f"/{name}", "Config": {"Labels": labels}, "State": {"Running": True}}


def listed(*names: str) -> list[dict[str, Any]]:
    return [{"Id": f"id-{name}", "Names": [f"/{name}"],
             "Labels": {"clairvoyant.model": MODEL, "clairvoyant.replica": name, "clairvoyant.owner": "cv-worker"}}
            for name in names]


def docker_actuator(url: str, **options: Any) -> DockerActuator:
    client = docker.DockerClient(base_url=url.replace("http://", "tcp://"), version=DOCKER_API[2:])
    return DockerActuator(client=client, **options)


def serve_engine(server: RecordingServer, *existing: str) -> None:
    server.routes[("GET", f"{DOCKER_API}/containers/json")] = (200, listed(*existing))
    server.routes[("POST", f"{DOCKER_API}/containers/create")] = (201, {"Id": CONTAINER_ID, "Warnings": []})
    server.routes[("GET", f"{DOCKER_API}/containers/{CONTAINER_ID}/json")] = (200, container("any"))
    server.routes[("POST", f"{DOCKER_API}/containers/{CONTAINER_ID}/start")] = (204, None)
    server.routes[("POST", f"{DOCKER_API}/containers/{CONTAINER_ID}/stop")] = (204, None)
    server.routes[("DELETE", f"{DOCKER_API}/containers/{CONTAINER_ID}")] = (204, None)


@pytest.mark.integration
async def test_docker_provision_runs_the_worker_image_with_its_id_and_labels(api_server: RecordingServer) -> None:
    serve_engine(api_server, f"cv-worker-{SLUG}-1")  # left by an earlier run: its name stays taken
    actuator = docker_actuator(api_server.url, image="clairvoyant-worker:test", network="clairvoyant_default",
                               environment={"CV_NATS_URL": "nats://nats:4222", "CV_RUNNER": "emulated"},
                               model_environment={MODEL: {"CV_GPU": "A100-80G"}})
    name = await actuator.provision(MODEL)
    assert name == f"cv-worker-{SLUG}-2"
    assert api_server.calls() == [
        ("GET", f"{DOCKER_API}/containers/json"),
        ("POST", f"{DOCKER_API}/containers/create"),
        ("GET", f"{DOCKER_API}/containers/{CONTAINER_ID}/json"),
        ("POST", f"{DOCKER_API}/containers/{CONTAINER_ID}/start"),
    ]
    listing, create = api_server.requests[0], api_server.requests[1]
    assert listing.query["all"] == ["1"]
    assert json.loads(listing.query["filters"][0]) == {
        "label": ["clairvoyant.owner=cv-worker", "clairvoyant.replica", "clairvoyant.model"]}
    assert create.query == {"name": [name]}
    assert create.body["Image"] == "clairvoyant-worker:test"
    assert sorted(create.body["Env"]) == sorted([
        "CV_NATS_URL=nats://nats:4222", "CV_RUNNER=emulated", "CV_GPU=A100-80G",
        f"CV_WORKER_ID={name}", f"CV_ADVERTISE_HOST={name}", f"CV_MODEL={MODEL}"])
    assert create.body["Labels"] == {"clairvoyant.model": MODEL, "clairvoyant.replica": name,
                                     "clairvoyant.owner": "cv-worker"}
    assert create.body["HostConfig"]["NetworkMode"] == "clairvoyant_default"
    assert list(create.body["NetworkingConfig"]) == ["clairvoyant_default"]

    assert await actuator.provision(MODEL) == f"cv-worker-{SLUG}-3"  # the engine is listed once
    assert len(api_server.requests) == 7


@pytest.mark.integration
async def test_docker_release_stops_then_removes_its_own_container_only(api_server: RecordingServer) -> None:
    serve_engine(api_server)
    name = f"cv-worker-{SLUG}-1"
    api_server.routes[("GET", f"{DOCKER_API}/containers/{name}/json")] = (200, container(name))
    api_server.routes[("GET", f"{DOCKER_API}/containers/nats/json")] = (200, container("nats", owner=""))
    actuator = docker_actuator(api_server.url, stop_timeout_s=7)

    await actuator.release(name, MODEL)
    assert api_server.calls() == [
        ("GET", f"{DOCKER_API}/containers/{name}/json"),
        ("POST", f"{DOCKER_API}/containers/{CONTAINER_ID}/stop"),
        ("DELETE", f"{DOCKER_API}/containers/{CONTAINER_ID}"),
    ]
    assert api_server.requests[1].query["t"] == ["7"]

    api_server.requests.clear()
    await actuator.release("nats", MODEL)  # not ours
    await actuator.release("cv-worker-gone-1", MODEL)  # 404: gone already
    assert api_server.calls() == [("GET", f"{DOCKER_API}/containers/nats/json"),
                                  ("GET", f"{DOCKER_API}/containers/cv-worker-gone-1/json")]

    api_server.routes[("DELETE", f"{DOCKER_API}/containers/{CONTAINER_ID}")] = (
        409, {"message": f"removal of container {CONTAINER_ID} is already in progress"})
    await actuator.release(name, MODEL)  # a concurrent release is removing it: done


@pytest.mark.integration
async def test_docker_running_and_close_cover_the_owners_running_containers(api_server: RecordingServer) -> None:
    serve_engine(api_server, "cv-worker-a-1", "cv-worker-a-2")
    for name in ("cv-worker-a-1", "cv-worker-a-2"):
        api_server.routes[("GET", f"{DOCKER_API}/containers/{name}/json")] = (200, container(name))
    actuator = docker_actuator(api_server.url)
    assert await actuator.running() == {"cv-worker-a-1": MODEL, "cv-worker-a-2": MODEL}
    assert api_server.requests[0].query.get("all", ["0"]) == ["0"]  # running containers only

    api_server.requests.clear()
    await actuator.close()
    calls = api_server.calls()
    assert calls[0] == ("GET", f"{DOCKER_API}/containers/json")
    assert sorted(calls[1:]) == sorted(
        [("GET", f"{DOCKER_API}/containers/{name}/json") for name in ("cv-worker-a-1", "cv-worker-a-2")]
        + [("POST", f"{DOCKER_API}/containers/{CONTAINER_ID}/stop"),
           ("DELETE", f"{DOCKER_API}/containers/{CONTAINER_ID}")] * 2
    )


@pytest.mark.integration
async def test_docker_failures_are_actuator_errors(api_server: RecordingServer) -> None:
    serve_engine(api_server)
    api_server.routes[("POST", f"{DOCKER_API}/containers/create")] = (500, {"message": "no space left on device"})
    actuator = docker_actuator(api_server.url)
    with pytest.raises(ActuatorError, match=f"docker: cannot start container cv-worker-{SLUG}-1 of "
                                            "clairvoyant-worker:latest: 500 Server Error.*no space left on device"):
        await actuator.provision(MODEL)
    with pytest.raises(ActuatorError, match="docker: cannot list containers: "):
        await docker_actuator(unreachable_url()).running()


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.skipif(not docker_available(), reason="no Docker engine answers")
async def test_docker_worker_container_on_a_real_engine(nats_url: str) -> None:
    client = docker.from_env()
    image = os.environ.get("CV_TEST_WORKER_IMAGE", "clairvoyant-worker:latest")
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        pytest.skip(f"no worker image {image} (docker build -f services/worker/Dockerfile -t {image} .)")
    actuator = DockerActuator(client=client, image=image, prefix=f"cv-test-{os.getpid()}",
                              environment={"CV_RUNNER": "emulated", "CV_NATS_URL": nats_url},
                              run_options={"network_mode": "host"})
    try:
        name = await actuator.provision(MODEL)
        assert await actuator.running() == {name: MODEL}
        await actuator.release(name, MODEL)
        assert await actuator.running() == {}
        await actuator.release(name, MODEL)
    finally:
        await actuator.close()
