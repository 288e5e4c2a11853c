"""How the autoscaler starts and stops worker replicas: one ``Actuator`` per platform, by name.

``ACTUATORS.create("local" | "docker" | "kubernetes", **options)`` builds one; the options are
its class's keyword arguments.
"""

from clairvoyant.autoscaler.actuators.base import ACTUATORS, Actuator, ActuatorError, is_pending, pending_id
from clairvoyant.autoscaler.actuators.docker import DockerActuator
from clairvoyant.autoscaler.actuators.kubernetes import KubernetesActuator
from clairvoyant.autoscaler.actuators.local import LocalActuator, LocalReplica

__all__ = [
    "ACTUATORS",
    "Actuator",
    "ActuatorError",
    "DockerActuator",
    "KubernetesActuator",
    "LocalActuator",
    "LocalReplica",
    "is_pending",
    "pending_id",
]
