"""Replicas as pods of one worker Deployment per model (the ``kubernetes`` client).

The Deployments come from deploy/kubernetes/worker-deployment.yaml, one per model; the actuator
only changes their replica counts.  A worker there uses its pod name as worker id (downward
API), so the replicas the scheduler sees are the pods listed here.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from clairvoyant.autoscaler.actuators.base import ACTUATORS, ActuatorError, is_pending, model_slug, pending_id

logger = logging.getLogger(__name__)

T = TypeVar("T")

MODEL_LABEL = "clairvoyant.model"  # on each worker pod: the model it serves (a label-safe name)
WORKER_SELECTOR = "app.kubernetes.io/name=clairvoyant-worker"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
RELEASED_COST = "-1000"  # below every other pod's (default 0): the ReplicaSet removes this one
GONE_PHASES = ("Succeeded", "Failed")


@ACTUATORS.register("kubernetes")
class KubernetesActuator:
    """Scales the Deployment ``deployment_template.format(model=<model slug>)`` in ``namespace``.

    ``provision`` adds one replica (read the scale, patch it +1) and returns a ``pending:`` id:
    the pod is named by its ReplicaSet.  ``release`` of a pod marks it with a pod-deletion-cost
    of -1000, patches the scale -1, then deletes that pod (the autoscaler drained it first).  The
    cost alone is not enough: a ReplicaSet removes unscheduled, pending and not-ready pods before
    it compares deletion costs, so while another replica of the model is starting it would remove
    that one.  Deleting the drained pod as well ends with the right pods either way: had the
    ReplicaSet picked another, it replaces it.  ``close`` leaves the pods to the cluster.

    Scale changes of this actuator are serialized (read, then patch); the autoscaler is the
    Deployments' only writer of ``replicas`` (no HorizontalPodAutoscaler on them).  ``api_client``
    defaults to the in-cluster service account, else the local kubeconfig, loaded on first use.
    """

    name = "kubernetes"

    def __init__(
        self,
        *,
        namespace: str = "clairvoyant",
        deployment_template: str = "cv-worker-{model}",
        label_selector: str = WORKER_SELECTOR,
        api_client: k8s.ApiClient | None = None,
    ) -> None:
        self.namespace = namespace
        self.deployment_template = deployment_template
        self.label_selector = label_selector
        self._api_client = api_client
        self._scale_lock = asyncio.Lock()
        self._provisioned: defaultdict[str, itertools.count[int]] = defaultdict(lambda: itertools.count(1))
        self._released: set[str] = set()  # scaled down for already: a repeated release does nothing

    def deployment_name(self, model: str) -> str:
        return self.deployment_template.format(model=model_slug(model))

    async def provision(self, model: str) -> str:
        replicas = await self._scale_by(model, +1)
        replica_id = pending_id(model, next(self._provisioned[model]))
        logger.info("scaled %s up to %d replicas (%s)", self.deployment_name(model), replicas, replica_id)
        return replica_id

    async def release(self, replica_id: str, model: str) -> None:
        if replica_id in self._released:
            return
        self._released.add(replica_id)  # at once: a concurrent release of it must not scale down too
        try:
            removed = await self._release(replica_id, model)
        except BaseException:
            self._released.discard(replica_id)  # not done: a retry does it
            raise
        if not removed:
            self._released.discard(replica_id)

    async def _release(self, replica_id: str, model: str) -> bool:
        """Mark the pod and scale down; False where the pod is no worker of ``model`` (nothing done)."""
        if not is_pending(replica_id):
            pod = await self._call(f"read pod {replica_id}", self._read_pod, replica_id)
            meta = pod.metadata if pod is not None else None
            if meta is None or meta.deletion_timestamp is not None:
                return True  # gone, or going: scaling down would remove another
            serves = (meta.labels or {}).get(MODEL_LABEL)
            if serves != model:
                logger.warning("pod %s/%s is no worker of %s (its %s label: %r); left alone",
                               self.namespace, replica_id, model, MODEL_LABEL, serves)
                return False
            body = {"metadata": {"annotations": {DELETION_COST: RELEASED_COST}}}
            await self._call(f"mark pod {replica_id} for removal", self._core.patch_namespaced_pod,
                             replica_id, self.namespace, body)
        replicas = await self._scale_by(model, -1)
        if not is_pending(replica_id):
            await self._call(f"delete pod {replica_id}", self._delete_pod, replica_id)
        logger.info("scaled %s down to %d replicas, removing %s", self.deployment_name(model), replicas, replica_id)
        return True

    async def running(self) -> dict[str, str]:
        pods = await self._call("list worker pods", self._core.list_namespaced_pod, self.namespace,
                                label_selector=self.label_selector)
        found: dict[str, str] = {}
        for pod in pods.items:
            meta = pod.metadata
            if meta is None or meta.name is None or meta.deletion_timestamp is not None:
                continue
            if pod.status is not None and pod.status.phase in GONE_PHASES:
                continue
            found[meta.name] = (meta.labels or {}).get(MODEL_LABEL, "")
        return found

    async def close(self) -> None:
        return None

    async def _scale_by(self, model: str, change: int) -> int:
        """Read the Deployment's scale and patch it by ``change`` (not below 0); the new count."""
        name = self.deployment_name(model)
        async with self._scale_lock:
            scale = await self._call(f"read the scale of deployment {name}",
                                     self._apps.read_namespaced_deployment_scale, name, self.namespace)
            current = scale.spec.replicas if scale.spec is not None else None
            replicas = max(0, (current or 0) + change)
            await self._call(f"scale deployment {name} to {replicas}", self._apps.patch_namespaced_deployment_scale,
                             name, self.namespace, {"spec": {"replicas": replicas}})
        return replicas

    @property
    def _apps(self) -> k8s.AppsV1Api:
        return k8s.AppsV1Api(self._client())

    @property
    def _core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self._client())

    def _client(self) -> k8s.ApiClient:
        if self._api_client is None:
            try:
                k8s_config.load_incluster_config()
            except k8s_config.ConfigException:
                try:
                    k8s_config.load_kube_config()
                except (k8s_config.ConfigException, OSError) as exc:
                    raise ActuatorError(f"kubernetes: no in-cluster service account and no kubeconfig: {exc}") from exc
            self._api_client = k8s.ApiClient()
        return self._api_client

    def _read_pod(self, name: str) -> k8s.V1Pod | None:
        """The pod ``name``, or None when there is none."""
        try:
            return self._core.read_namespaced_pod(name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _delete_pod(self, name: str) -> None:
        """Delete the pod ``name``; one already gone is fine."""
        try:
            self._core.delete_namespaced_pod(name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def _call(self, what: str, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``call(*args, **kwargs)`` in a thread; a failed request becomes ActuatorError."""
        try:
            return await asyncio.to_thread(call, *args, **kwargs)
        except ApiException as exc:
            raise ActuatorError(
                f"kubernetes: cannot {what} in namespace {self.namespace}: {exc.status} {exc.reason}"
                f"{_status_message(exc)}"
            ) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ActuatorError(f"kubernetes: cannot {what} in namespace {self.namespace}: {exc}") from exc


def _status_message(exc: ApiException) -> str:
    """The API server's own explanation (a Status object's message), when it sent one."""
    try:
        message = json.loads(exc.body or "{}").get("message", "")
    except (ValueError, AttributeError):
        return ""
    return f": {message}" if message else ""
