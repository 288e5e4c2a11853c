"""The industry's autoscalers as scaling policies: ``reactive`` and ``predictive``.

``reactive``: KEDA over the vLLM production stack (a Prometheus trigger on
``vllm:num_requests_waiting`` with threshold 5, ``pollingInterval`` 15 s, ``cooldownPeriod`` 360 s
before scaling to zero), with AIBrix's KPA smoothing (a 180 s stable window and a 60 s panic window
with threshold 2.0, scale-up rate at most 2x a tick, scale-down stabilized over 300 s) and llm-d's
KV-utilization trigger (0.80).  Per model: the replicas the waiting requests ask for at 5 per
replica, or the KV pressure asks for at 0.80, whichever is more (AIBrix: multi-metric = max).

``predictive``: NVIDIA Dynamo's planner.  Per model and adjustment interval, a forecast of the
request rate and the mean input and output lengths (Dynamo's Kalman predictor: a local linear
trend, F=[[1,1],[0,1]], H=[1,0], Q=diag(1.0, 0.1), R=10.0, constant until 5 points), sized from
the profiled throughput: replicas = ceil(rate x time per call / calls per replica), where time per
call is input/prefill throughput + output x decode step (Little's law over the model's profile).

Both know nothing of workflows.  docs/autoscaling.md lists every default and its source.
"""

from __future__ import annotations

import math
from collections import deque
from typing import NamedTuple

from clairvoyant.policy.scaling import (
    SCALING_POLICIES,
    ModelTraffic,
    ReplicaPhase,
    ScalingDecision,
    ScalingInput,
    replicas_for,
    serving_counts,
)


class _Sample(NamedTuple):
    time: float
    waiting: float  # requests waiting for the model (global queue + engine queues)
    kv_replicas: float  # replicas the KV utilization asks for at the target
    active: bool  # any request of the model queued or running


@SCALING_POLICIES.register("reactive")
class ReactiveScaling:
    """KEDA + vLLM production stack, with AIBrix KPA's stable and panic windows."""

    def __init__(
        self,
        polling_interval_s: float = 15.0,
        waiting_per_replica: float = 5.0,
        kv_utilization_target: float = 0.80,
        stable_window_s: float = 180.0,
        panic_window_s: float = 60.0,
        panic_threshold: float = 2.0,
        max_scale_up_rate: float = 2.0,
        scale_down_stabilization_s: float = 300.0,
        cooldown_s: float = 360.0,
    ) -> None:
        self.polling_interval_s = polling_interval_s
        self.waiting_per_replica = waiting_per_replica
        self.kv_utilization_target = kv_utilization_target
        self.stable_window_s = stable_window_s
        self.panic_window_s = panic_window_s
        self.panic_threshold = panic_threshold
        self.max_scale_up_rate = max_scale_up_rate
        self.scale_down_stabilization_s = scale_down_stabilization_s
        self.cooldown_s = cooldown_s
        self._samples: dict[str, deque[_Sample]] = {}
        self._recommendations: dict[str, deque[tuple[float, int]]] = {}
        self._last_active: dict[str, float] = {}
        self._panic_until: dict[str, float] = {}
        self._last_poll: float | None = None
        self._targets: dict[str, int] = {}

    def tick(self, state: ScalingInput, now: float) -> ScalingDecision:
        current = serving_counts(state.replicas)
        if self._last_poll is not None and now - self._last_poll < self.polling_interval_s - 1e-9:
            targets = {m: self._targets.get(m, current.get(m, 0)) for m in set(current) | set(self._targets)}
            return ScalingDecision(targets=targets, diagnostics={"polled": 0.0})
        self._last_poll = now
        reasons: dict[str, str] = {}
        diagnostics: dict[str, float] = {"polled": 1.0}
        for model, profile in sorted(state.models.items()):
            self._observe(model, state, now)
            replicas = current.get(model, 0)
            stable = self._desired(model, now, self.stable_window_s)
            panic = self._desired(model, now, self.panic_window_s)
            if replicas and panic >= self.panic_threshold * replicas:
                self._panic_until[model] = now + self.stable_window_s
            panicking = now < self._panic_until.get(model, -math.inf)
            desired = max(panic, replicas) if panicking else stable
            desired = min(desired, max(1, math.ceil(self.max_scale_up_rate * replicas)))
            if now - self._last_active.get(model, -math.inf) <= self.cooldown_s:
                desired = max(desired, 1)  # the keep-alive: no scale to zero within the cooldown
            desired = self._stabilized(model, desired, now)
            desired = max(desired, profile.min_replicas)
            if profile.max_replicas is not None:
                desired = min(desired, profile.max_replicas)
            self._targets[model] = desired
            reasons[model] = f"stable {stable}, panic {panic}{' (panicking)' if panicking else ''}"
            diagnostics[f"desired.{model}"] = float(desired)
        targets = {m: self._targets.get(m, n) for m, n in current.items()}
        targets.update({m: self._targets[m] for m in state.models})
        return ScalingDecision(targets=targets, diagnostics=diagnostics, reasons=reasons)

    def _observe(self, model: str, state: ScalingInput, now: float) -> None:
        ready = [r for r in state.replicas if r.model == model and r.phase is ReplicaPhase.READY]
        waiting = state.queued.get(model, 0) + sum(r.waiting for r in ready)
        kv = sum(r.kv_utilization for r in ready)
        active = waiting > 0 or any(r.running for r in ready) or any(c.model == model for c in state.active)
        if active:
            self._last_active[model] = now
        samples = self._samples.setdefault(model, deque())
        samples.append(_Sample(now, float(waiting), kv / self.kv_utilization_target, active))
        horizon = max(self.stable_window_s, self.panic_window_s)
        while samples and samples[0].time < now - horizon:
            samples.popleft()

    def _desired(self, model: str, now: float, window_s: float) -> int:
        """The replicas the window's average waiting requests and KV pressure ask for."""
        window = [s for s in self._samples.get(model, ()) if s.time >= now - window_s]
        if not window:
            return 0
        waiting = sum(s.waiting for s in window) / len(window)
        kv_replicas = sum(s.kv_replicas for s in window) / len(window)
        by_waiting = math.ceil(waiting / self.waiting_per_replica - 1e-9) if waiting > 0 else 0
        return max(by_waiting, math.ceil(kv_replicas - 1e-9) if kv_replicas > 0 else 0)

    def _stabilized(self, model: str, desired: int, now: float) -> int:
        """HPA's scale-down stabilization: the largest recommendation of the last window."""
        history = self._recommendations.setdefault(model, deque())
        history.append((now, desired))
        while history and history[0][0] < now - self.scale_down_stabilization_s:
            history.popleft()
        return max(r for _, r in history)


class LocalLinearTrend:
    """Dynamo's Kalman load predictor: a two-state (level, trend) filter; until ``min_points``
    observations it predicts the last value (Dynamo's constant predictor)."""

    def __init__(
        self, q_level: float = 1.0, q_trend: float = 0.1, r: float = 10.0, min_points: int = 5
    ) -> None:
        self.q_level, self.q_trend, self.r, self.min_points = q_level, q_trend, r, min_points
        self.points = 0
        self.last = 0.0
        self.level, self.trend = 0.0, 0.0
        self.p = [[1000.0, 0.0], [0.0, 1000.0]]  # covariance: a vague prior

    def observe(self, value: float) -> None:
        if self.points == 0:
            if value <= 0:
                return  # Dynamo skips the leading idle zeros
            self.level = value
        self.points += 1
        self.last = value
        # Predict: x = F x, P = F P F' + Q with F = [[1, 1], [0, 1]].
        level, trend = self.level + self.trend, self.trend
        (a, b), (c, d) = self.p
        p00 = a + b + c + d + self.q_level
        p01 = b + d
        p10 = c + d
        p11 = d + self.q_trend
        # Update with z = level + noise (H = [1, 0]).
        s = p00 + self.r
        k0, k1 = p00 / s, p10 / s
        residual = value - level
        self.level, self.trend = level + k0 * residual, trend + k1 * residual
        self.p = [[(1 - k0) * p00, (1 - k0) * p01], [p10 - k1 * p00, p11 - k1 * p01]]

    def predict(self) -> float:
        """The next interval's value (never negative)."""
        if self.points < self.min_points:
            return max(self.last, 0.0)
        return max(self.level + self.trend, 0.0)


class _ModelForecast:
    def __init__(self) -> None:
        self.rate = LocalLinearTrend()  # requests per second
        self.input_len = LocalLinearTrend()
        self.output_len = LocalLinearTrend()
        self.previous: ModelTraffic | None = None


@SCALING_POLICIES.register("predictive")
class PredictiveScaling:
    """Dynamo planner: forecast rate and lengths per model each adjustment interval, then size
    replicas from the profile.  Its default interval is Dynamo's ``adjustment_interval`` (180 s)."""

    def __init__(self, adjustment_interval_s: float = 180.0) -> None:
        self.adjustment_interval_s = adjustment_interval_s
        self._forecasts: dict[str, _ModelForecast] = {}
        self._last_adjustment: float | None = None
        self._targets: dict[str, int] = {}

    def tick(self, state: ScalingInput, now: float) -> ScalingDecision:
        current = serving_counts(state.replicas)
        due = (
            self._last_adjustment is None or now - self._last_adjustment >= self.adjustment_interval_s - 1e-9
        )
        reasons: dict[str, str] = {}
        diagnostics: dict[str, float] = {"adjusted": 1.0 if due else 0.0}
        if due:
            interval = (
                self.adjustment_interval_s if self._last_adjustment is None else now - self._last_adjustment
            )
            self._last_adjustment = now
            for model, profile in sorted(state.models.items()):
                forecast = self._forecasts.setdefault(model, _ModelForecast())
                self._observe(forecast, state.traffic.get(model, ModelTraffic()), max(interval, 1e-9))
                rate = forecast.rate.predict()
                seconds_per_call = (
                    forecast.input_len.predict() / max(profile.prefill_tokens_per_s, 1e-9)
                    + forecast.output_len.predict() * profile.decode_step_s
                )
                concurrency = rate * seconds_per_call
                desired = max(profile.min_replicas, replicas_for(concurrency, profile.calls_per_replica))
                if any(call.model == model for call in state.active) or state.queued.get(model, 0):
                    desired = max(desired, 1)  # Dynamo's min_endpoint while the model has work
                if profile.max_replicas is not None:
                    desired = min(desired, profile.max_replicas)
                self._targets[model] = desired
                reasons[model] = f"forecast {rate:.3f} req/s x {seconds_per_call:.1f} s per call"
                diagnostics[f"forecast_rate.{model}"] = rate
        targets = {m: self._targets.get(m, n) for m, n in current.items()}
        targets.update({m: self._targets[m] for m in state.models if m in self._targets})
        return ScalingDecision(targets=targets, diagnostics=diagnostics, reasons=reasons)

    @staticmethod
    def _observe(forecast: _ModelForecast, traffic: ModelTraffic, interval_s: float) -> None:
        before = forecast.previous or ModelTraffic()
        forecast.previous = traffic
        requests = traffic.requests_total - before.requests_total
        completed = traffic.completed_total - before.completed_total
        forecast.rate.observe(requests / interval_s)
        if requests > 0:
            forecast.input_len.observe((traffic.input_tokens_total - before.input_tokens_total) / requests)
        if completed > 0:
            forecast.output_len.observe(
                (traffic.output_tokens_total - before.output_tokens_total) / completed
            )
