"""deploy/kubernetes/ must parse and agree with the kubernetes actuator, the settings classes and
the images: worker Deployments are named and labelled as the actuator finds them, each pod's
worker id is its name, and the autoscaler's Role grants exactly the requests the actuator sends.

Nothing is applied to a cluster; the actuator's requests are recorded by a local HTTP server.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from clairvoyant.autoscaler.actuators import ACTUATORS, KubernetesActuator
from clairvoyant.autoscaler.actuators.kubernetes import MODEL_LABEL, WORKER_SELECTOR
from clairvoyant.core.config import ServiceSettings
from tests.autoscaler.conftest import Recorded, RecordingServer
from tests.deploy.test_compose_consistency import dockerfile

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]
MANIFEST_DIR = REPO_ROOT / "deploy" / "kubernetes"
NAMESPACE = "clairvoyant"
LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")


def documents() -> list[dict[str, Any]]:
    found = []
    for path in sorted(MANIFEST_DIR.glob("*.yaml")):
        found += [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    return found


DOCS = documents()


def of_kind(kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in DOCS if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def worker_deployments() -> list[dict[str, Any]]:
    return [d for d in of_kind("Deployment")
            if d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/name") == "clairvoyant-worker"]


def autoscaler_deployment() -> dict[str, Any]:
    (found,) = of_kind("Deployment", "cv-autoscaler")
    return found


def container_of(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Name -> the env entry ({"value": ...} or {"valueFrom": ...})."""
    return {e["name"]: e for e in container.get("env", [])}


def selector_labels(selector: str) -> dict[str, str]:
    return dict(term.split("=", 1) for term in selector.split(","))


def probe_command(container: dict[str, Any]) -> str:
    command = container["readinessProbe"]["exec"]["command"]
    assert command[:2] == ["python", "-c"], command
    return str(command[2])


def test_every_manifest_parses_and_lives_in_the_namespace() -> None:
    assert {d["kind"] for d in DOCS} >= {"Namespace", "Deployment", "ServiceAccount", "Role", "RoleBinding"}
    (namespace,) = of_kind("Namespace")
    assert namespace["metadata"]["name"] == NAMESPACE
    for doc in DOCS:
        assert doc["apiVersion"] and doc["metadata"]["name"], doc
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["metadata"]
    assert KubernetesActuator().namespace == NAMESPACE  # the actuator's default


def test_worker_deployments_are_named_and_labelled_as_the_actuator_finds_them() -> None:
    deployments = worker_deployments()
    assert deployments
    actuator = KubernetesActuator()
    for deployment in deployments:
        template_labels = deployment["spec"]["template"]["metadata"]["labels"]
        model = template_labels[MODEL_LABEL]
        assert LABEL_VALUE.match(model) and len(model) <= 63, f"{model!r} is not a valid label value"
        assert deployment["metadata"]["name"] == actuator.deployment_name(model)
        assert selector_labels(WORKER_SELECTOR).items() <= template_labels.items()
        assert deployment["spec"]["selector"]["matchLabels"].items() <= template_labels.items()
        assert deployment["spec"]["selector"]["matchLabels"][MODEL_LABEL] == model  # one model per ReplicaSet
        assert "replicas" not in deployment["spec"], "the autoscaler owns the count; apply must not reset it"
        env = env_of(container_of(deployment))
        assert env["CV_MODEL"]["value"] == model


def test_a_worker_pod_uses_its_name_as_worker_id_and_advertises_its_ip(
    load_settings: Callable[[str], type[ServiceSettings] | None],
    settings_env_name: Callable[[type[ServiceSettings], str], str],
) -> None:
    settings = load_settings("worker")
    assert settings is not None
    known = {settings_env_name(settings, field) for field in settings.model_fields}
    for deployment in worker_deployments():
        container = container_of(deployment)
        env = env_of(container)
        assert env["CV_WORKER_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        assert env["CV_ADVERTISE_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert {name for name in env if name.startswith("CV_")} <= known
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        grpc_port = int(env.get("CV_WORKER_GRPC_PORT", {}).get("value", settings.model_fields["worker_grpc_port"].default))
        assert ports == {"grpc": grpc_port, "http": int(env["CV_WORKER_HTTP_PORT"]["value"])}
        probe = probe_command(container)
        assert "grpc_health_serving" in probe and "CV_WORKER_GRPC_PORT" in probe and f"'{grpc_port}'" in probe


def test_autoscaler_deployment_runs_the_kubernetes_actuator_as_its_service_account(
    load_settings: Callable[[str], type[ServiceSettings] | None],
    settings_env_name: Callable[[type[ServiceSettings], str], str],
) -> None:
    deployment = autoscaler_deployment()
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    pod = deployment["spec"]["template"]["spec"]
    (account,) = of_kind("ServiceAccount")
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    container = container_of(deployment)
    env = env_of(container)
    assert env["CV_ACTUATOR"]["value"] == "kubernetes" and "kubernetes" in ACTUATORS
    options = json.loads(env["CV_ACTUATOR_OPTIONS"]["value"].replace("$(POD_NAMESPACE)", NAMESPACE))
    assert KubernetesActuator(**options).namespace == NAMESPACE
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}

    settings = load_settings("autoscaler")
    if settings is None:
        pytest.skip("clairvoyant.autoscaler.config does not exist yet")
    known = {settings_env_name(settings, field) for field in settings.model_fields}
    assert {name for name in env if name.startswith("CV_")} <= known
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": settings.model_fields["autoscaler_port"].default,
                     "metrics": settings.model_fields["metrics_port"].default}
    image_probe = shlex.split(dockerfile("autoscaler").healthcheck)  # python -c "..."
    assert container["readinessProbe"]["exec"]["command"] == image_probe  # as the image probes itself


def test_role_binding_gives_the_autoscaler_its_role() -> None:
    (binding,) = of_kind("RoleBinding")
    (role,) = of_kind("Role")
    (account,) = of_kind("ServiceAccount")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": NAMESPACE}]


def granted() -> set[tuple[str, str, str]]:
    (role,) = of_kind("Role")
    return {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def permission(request: Recorded) -> tuple[str, str, str]:
    """The RBAC (api group, resource, verb) a request to the API server needs."""
    match = re.fullmatch(r"/(?:api/v1|apis/(?P<group>[^/]+)/v1)/namespaces/[^/]+/(?P<resource>[^/]+)"
                         r"(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?", request.path)
    assert match, request.path
    resource = match["resource"] + (f"/{match['sub']}" if match["sub"] else "")
    verb = {"PATCH": "patch", "DELETE": "delete", "POST": "create", "PUT": "update"}.get(request.method)
    if verb is None:
        verb = "get" if match["name"] else "list"
    return match["group"] or "", resource, verb


async def test_the_role_grants_exactly_what_the_actuator_sends() -> None:
    deployment = worker_deployments()[0]
    model = deployment["spec"]["template"]["metadata"]["labels"][MODEL_LABEL]
    name = deployment["metadata"]["name"]
    pod_name = f"{name}-5d8c7b9f4-x2x7q"
    scale = {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": name}, "spec": {"replicas": 1}}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": pod_name, "labels": deployment["spec"]["template"]["metadata"]["labels"]}}
    server = RecordingServer()
    scale_path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{name}/scale"
    pods_path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    server.routes.update({
        ("GET", scale_path): (200, scale), ("PATCH", scale_path): (200, scale),
        ("GET", f"{pods_path}/{pod_name}"): (200, pod), ("PATCH", f"{pods_path}/{pod_name}"): (200, pod),
        ("DELETE", f"{pods_path}/{pod_name}"): (200, pod),
        ("GET", pods_path): (200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [pod]}),
    })
    try:
        actuator = KubernetesActuator(namespace=NAMESPACE, api_client=k8s.ApiClient(k8s.Configuration(host=server.url)))
        await actuator.provision(model)
        assert await actuator.running() == {pod_name: model}
        await actuator.release(pod_name, model)
        await actuator.close()
    finally:
        server.close()
    assert {permission(r) for r in server.requests} == granted() == {
        ("apps", "deployments/scale", "get"), ("apps", "deployments/scale", "patch"),
        ("", "pods", "get"), ("", "pods", "list"), ("", "pods", "patch"), ("", "pods", "delete"),
    }
