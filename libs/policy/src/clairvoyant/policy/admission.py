"""Late binding at the knee: a worker takes new calls only while its batch stays at its efficient
operating point, so the priority order decides who runs and an urgent call decodes at small-batch
speed.

A decode step of ``b`` sequences costs about ``base + per_seq × b`` seconds (the worker reports both:
``WorkerReport.decode_base_s`` / ``decode_per_seq_s``, from its cost model or its timed steps).  So
throughput ``b / (base + per_seq × b)`` climbs toward its ceiling ``1 / per_seq`` while each call's
token latency grows linearly in ``b``.  The knee is the smallest batch that reaches a fraction φ of
the ceiling::

    b / (base + per_seq × b) >= φ / per_seq   <=>   b >= φ / (1 − φ) × base / per_seq

At φ = 0.5 a step takes twice as long as a lone sequence's; at 0.7, 3.3 times; φ = 1 turns the
limit off.  Since ``per_seq`` grows with the sequences' context, the knee falls as contexts grow: a
long-context engine admits fewer calls (the KV load the knee is taken against).

A routing policy opts in with ``Capability.ADMITS``: the scheduler then holds at most
``admission_limit(report)`` placements on each worker (``WorkerView.admission_limit``), and the calls
beyond wait in the global queue, ranked, instead of in the engine.  Work conservation holds: the
limit is at least 1, so a worker never idles while a call it could serve waits.  Nothing lower in
the priority order is placed while a higher call of the same model waits, because dispatch places in
priority order and stops at the first call that finds no room (``GlobalScheduler.dispatch``).
Measured in docs/scheduling.md ("Admission at the knee").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clairvoyant.policy.types import WorkerReport


@dataclass(frozen=True, slots=True)
class KneeConfig:
    # φ: the share of the batch's throughput ceiling that the admitted batch reaches (1: no limit).
    # 0.7 measured best of 0.4-1.0 on two workloads under a burst (docs/scheduling.md).
    throughput_fraction: float = 0.7
    # A call more urgent than a worker's least urgent placement may be placed beyond the knee, the
    # engine then preempting for it (docs/scheduling.md).  Off: measured worse on deep_research.
    displace: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.throughput_fraction <= 1.0:
            raise ValueError(f"throughput_fraction must be in (0, 1], not {self.throughput_fraction}")


def knee_batch(report: WorkerReport, throughput_fraction: float) -> int:
    """The smallest batch reaching ``throughput_fraction`` of the worker's decode-throughput ceiling,
    within [1, max_batch]; 0 when there is no knee to hold to: the worker reports no decode speed,
    a sequence costs it nothing more, or the fraction is 1."""
    base, per_seq = report.decode_base_s, report.decode_per_seq_s
    if throughput_fraction >= 1.0 or per_seq <= 0.0 or base <= 0.0:
        return 0
    batch = math.ceil(throughput_fraction / (1.0 - throughput_fraction) * base / per_seq - 1e-9)
    return max(1, min(report.max_batch or batch, batch))


class KneeAdmission:
    """The ``ADMITS`` hook for a routing policy: hold each worker at its knee (``knee_batch``)."""

    knee: KneeConfig = KneeConfig()

    def admission_limit(self, report: WorkerReport) -> int:
        """Placements the scheduler may hold on the reporting worker; 0: the scheduler's default."""
        return knee_batch(report, self.knee.throughput_fraction)

    def displaces(self) -> bool:
        return self.knee.displace
