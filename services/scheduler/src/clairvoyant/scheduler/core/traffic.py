"""Per-model traffic counters: what an autoscaler differences between two readings.

Cumulative since the scheduler started and never reset; a submitted request counts once per
``submit`` (a re-submitted id counts again), a completion only when it was served.
"""

from __future__ import annotations

from clairvoyant.policy.scaling import ModelTraffic
from clairvoyant.policy.types import QueuedRequest


class TrafficCounters:
    def __init__(self) -> None:
        self._by_model: dict[str, ModelTraffic] = {}

    def on_submit(self, request: QueuedRequest) -> None:
        """``request`` joined its model's queue; its prompt tokens are the gateway's estimate."""
        seen = self._by_model.get(request.model, ModelTraffic())
        self._by_model[request.model] = seen._replace(
            requests_total=seen.requests_total + 1,
            input_tokens_total=seen.input_tokens_total + request.prompt_tokens,
        )

    def on_served(self, model: str, output_tokens: int) -> None:
        """A call of ``model`` completed as served, having generated ``output_tokens``."""
        seen = self._by_model.get(model, ModelTraffic())
        self._by_model[model] = seen._replace(
            completed_total=seen.completed_total + 1,
            output_tokens_total=seen.output_tokens_total + max(output_tokens, 0),
        )

    def by_model(self) -> dict[str, ModelTraffic]:
        """Every model that has had a request, by name."""
        return dict(sorted(self._by_model.items()))
