"""Replicas as containers of the worker image on a Docker engine (the ``docker`` SDK)."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import docker
import requests
from docker.errors import APIError, DockerException, NotFound

from clairvoyant.autoscaler.actuators.base import ACTUATORS, ActuatorError, model_slug

logger = logging.getLogger(__name__)

T = TypeVar("T")

MODEL_LABEL = "clairvoyant.model"
REPLICA_LABEL = "clairvoyant.replica"
OWNER_LABEL = "clairvoyant.owner"  # the actuator's prefix: several autoscalers may share an engine
DEFAULT_IMAGE = "clairvoyant-worker:latest"  # docker build -f services/worker/Dockerfile -t clairvoyant-worker .


@ACTUATORS.register("docker")
class DockerActuator:
    """Containers of ``image`` (built from services/worker/Dockerfile) on ``network``, named
    ``<prefix>-<model slug>-<n>``; the name is the worker id and the host other services reach it
    by (CV_WORKER_ID and CV_ADVERTISE_HOST), as in docker-compose.yml.  Each container carries
    the labels clairvoyant.model, clairvoyant.replica and clairvoyant.owner (= ``prefix``):
    ``running`` and ``release`` touch only containers whose owner label is this actuator's.

    Environment: ``environment`` (CV_NATS_URL, CV_RUNNER, ...), then
    ``model_environment[model]``, then the worker id, host and model.  ``run_options`` go to
    ``containers.run`` as they are (``device_requests`` for GPUs, ``mem_limit``, ...).  ``client``
    defaults to ``docker.from_env()``, made on first use.
    """

    name = "docker"

    def __init__(
        self,
        *,
        image: str = DEFAULT_IMAGE,
        network: str | None = None,
        environment: Mapping[str, str] | None = None,
        model_environment: Mapping[str, Mapping[str, str]] | None = None,
        run_options: Mapping[str, Any] | None = None,
        prefix: str = "cv-worker",
        stop_timeout_s: int = 10,
        client: docker.DockerClient | None = None,
    ) -> None:
        self.image = image
        self.network = network
        self.environment = dict(environment or {})
        self.model_environment = {model: dict(env) for model, env in (model_environment or {}).items()}
        self.run_options = dict(run_options or {})
        self.prefix = prefix
        self.stop_timeout_s = stop_timeout_s
        self._client = client
        self._counters: defaultdict[str, itertools.count[int]] = defaultdict(lambda: itertools.count(1))
        self._taken: set[str] | None = None  # container names of this owner, read on first provision
        self._lock = asyncio.Lock()  # one name chosen at a time

    async def provision(self, model: str) -> str:
        async with self._lock:
            if self._taken is None:  # containers left by an earlier run keep their names
                self._taken = set(await self._call("list containers", self._names, True))
            name = f"{self.prefix}-{model_slug(model)}-{next(self._counters[model])}"
            while name in self._taken:
                name = f"{self.prefix}-{model_slug(model)}-{next(self._counters[model])}"
            self._taken.add(name)
        environment = {
            **self.environment,
            **self.model_environment.get(model, {}),
            "CV_WORKER_ID": name,
            "CV_ADVERTISE_HOST": name,
            "CV_MODEL": model,
        }
        labels = {MODEL_LABEL: model, REPLICA_LABEL: name, OWNER_LABEL: self.prefix}

        def run() -> None:
            self.client.containers.run(
                self.image, detach=True, name=name, environment=environment, labels=labels,
                network=self.network, **self.run_options,
            )

        await self._call(f"start container {name} of {self.image}", run)
        logger.info("started container %s (%s) from %s", name, model, self.image)
        return name

    async def release(self, replica_id: str, model: str) -> None:
        def stop() -> bool:
            try:
                container = self.client.containers.get(replica_id)
                if container.labels.get(OWNER_LABEL) != self.prefix:
                    return False  # not one of ours: left alone
                container.stop(timeout=self.stop_timeout_s)
                container.remove()
            except NotFound:  # gone already
                return False
            except APIError as exc:
                if exc.status_code == 409:  # a concurrent release is removing it
                    return False
                raise
            return True

        if await self._call(f"stop and remove container {replica_id}", stop):
            logger.info("stopped and removed container %s", replica_id)

    async def running(self) -> dict[str, str]:
        listed = await self._call("list containers", self._list, False)
        return {labels[REPLICA_LABEL]: labels[MODEL_LABEL] for labels in listed}

    async def close(self) -> None:
        names = await self.running()
        await asyncio.gather(*(self.release(name, model) for name, model in names.items()))

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = docker.from_env()
        return self._client

    def _list(self, all_states: bool) -> list[dict[str, str]]:
        """The labels of this owner's containers; running ones only unless ``all_states``."""
        filters = {"label": [f"{OWNER_LABEL}={self.prefix}", REPLICA_LABEL, MODEL_LABEL]}
        found = self.client.api.containers(all=all_states, filters=filters)
        return [c.get("Labels") or {} for c in found]

    def _names(self, all_states: bool) -> list[str]:
        return [labels[REPLICA_LABEL] for labels in self._list(all_states)]

    async def _call(self, what: str, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)`` in a thread; an SDK or connection failure becomes ActuatorError."""
        try:
            return await asyncio.to_thread(call, *args)
        except (DockerException, requests.RequestException) as exc:
            raise ActuatorError(f"docker: cannot {what}: {exc}") from exc
