"""What the Aragog modules share: the router contract and the engines' throughput profiles.

Aragog (seeds/002) splits a workflow's model choice in two (§3): once per request, a
*configuration router* finds every configuration (one model per agent, ``ConfigSpace``) that
keeps the accuracy of the most expensive one; then, stage by stage, a scheduler picks among those
by the engines' current load.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from clairvoyant.core.configspace import ConfigSpace


class ConfigRouter(Protocol):
    """Which configurations keep the reference configuration's accuracy for one input (§3.1).

    The seed trains one binary router per configuration; ``predict`` runs the routers of
    ``configs`` on the input, one router call each, and must be deterministic.
    """

    def predict(self, space: ConfigSpace, text: str, configs: Sequence[int]) -> list[bool]:
        """For each of ``configs`` (configurations of ``space``), whether it is accurate for the
        input ``text``."""
        ...


class EngineProfile(NamedTuple):
    """A model's engine as the offline profile has it (§3, "Aragog profiles the latency and
    throughput of serving engines under different batch sizes").

    ``throughput[b]`` is one replica's output tokens per second with ``b`` calls running
    (``throughput[0] == 0``); ``saturation`` is the batch beyond which throughput no longer
    improves, the replica's slots."""

    model: str
    saturation: int
    throughput: tuple[float, ...]

    def gain(self, running: int) -> float:
        """The forecast throughput gained by one more call on a replica running ``running``
        (0 at or past saturation)."""
        if running >= self.saturation or running + 1 >= len(self.throughput):
            return 0.0
        return self.throughput[running + 1] - self.throughput[running]
