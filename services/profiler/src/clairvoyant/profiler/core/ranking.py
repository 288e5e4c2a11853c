"""Kairos agent ranking (seed 004, §5.1): Wasserstein distances + 1-D classical MDS with a zero anchor.

Each agent has a distribution of remaining latency to the end of its workflow (``stats.py``).
Kairos computes the pairwise Wasserstein distances between these distributions together with an
ideal "zero latency" distribution, embeds the distance matrix in one dimension with
multidimensional scaling, and ranks agents by their position on that axis, oriented so that the
anchor's end means the least remaining latency: agents closest to the anchor run first.

Choices: classical (Torgerson) MDS — double-centred squared distances, top eigenvector scaled by
the root of its eigenvalue; W1 is computed on 200-point quantile sketches (exact for equal-mass
cells); the axis is flipped when the anchor lies above the agents' mean, and coordinates are
reported as signed distance from the anchor.  Rank 0 is the highest priority (least remaining);
ties break by agent id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from clairvoyant.profiler.core.stats import sketch


@dataclass(frozen=True, slots=True)
class AgentRanking:
    rank: dict[str, int]  # 0 = least remaining latency = schedule first
    coordinate: dict[str, float]  # position on the oriented MDS axis, the anchor at 0


def classical_mds_1d(distances: np.ndarray) -> np.ndarray:
    n = distances.shape[0]
    centring = np.eye(n) - np.full((n, n), 1.0 / n)
    gram = -0.5 * centring @ (distances**2) @ centring
    values, vectors = np.linalg.eigh(gram)
    top = int(np.argmax(values))
    return vectors[:, top] * np.sqrt(max(float(values[top]), 0.0))


def kairos_ranking(remaining_s: Mapping[str, Sequence[float]]) -> AgentRanking:
    """Rank agents by their remaining-latency distributions (agents without samples are skipped)."""
    names = sorted(a for a, v in remaining_s.items() if len(v) > 0)
    if not names:
        return AgentRanking({}, {})
    sketches = [sketch(remaining_s[a]) for a in names] + [np.zeros(len(sketch([0.0])))]
    stacked = np.vstack(sketches)
    distances = np.mean(np.abs(stacked[:, None, :] - stacked[None, :, :]), axis=2)
    axis = classical_mds_1d(distances)
    anchor = axis[-1]
    oriented = axis - anchor
    if len(names) and float(np.mean(oriented[:-1])) < 0:
        oriented = -oriented
    coordinate = {a: float(oriented[i]) for i, a in enumerate(names)}
    # Agents with the same distribution get coordinates that differ only by the eigensolver's
    # rounding, which varies with the BLAS build and its threads: compare at 1e-9 of the axis'
    # span, so such ties fall to the name on every machine.
    span = float(np.max(np.abs(oriented))) or 1.0
    order = sorted(names, key=lambda a: (round(coordinate[a] / span, 9), a))
    return AgentRanking({a: i for i, a in enumerate(order)}, coordinate)
