"""Configuration routers that need no trained network (Aragog, seeds/002 §3.1), and the text
features every router here shares.

- ``hashed_ngrams``: word uni- and bigrams hashed (crc32) into a fixed vector; no download.
- ``KnownSetsRouter``: accurate sets known exactly per input text (an oracle for baselines and tests).
- ``TableRouter``: accurate sets per input class from an offline profile, the class found by the
  nearest centroid (the lookup the project's preset uses where no classifier is trained).
"""

from __future__ import annotations

import math
import re
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from clairvoyant.core.configspace import ConfigSpace
from clairvoyant.policy.aragog.types import ConfigRouter

FEATURE_DIM = 2**14
NGRAM_ORDERS = (1, 2)
_WORD = re.compile(r"\w+")


class LabelledInput(NamedTuple):
    """One training input: its text, its class in the offline profile, and the mask of the
    configurations (of one ``ConfigSpace``) that kept the reference's accuracy on it."""

    text: str
    input_class: str
    accurate: int


class RouterQuality(NamedTuple):
    precision: float  # labelled accurate / predicted accurate (1.0 when nothing is predicted)
    recall: float  # predicted / labelled accurate (1.0 when nothing is labelled)


def ngram_weights(text: str, dim: int = FEATURE_DIM, n: Sequence[int] = NGRAM_ORDERS) -> dict[int, float]:
    """``hashed_ngrams`` as a sparse {index: weight} map (the non-zero entries only)."""
    words = _WORD.findall(text.lower())
    counts: Counter[int] = Counter()
    for order in n:
        for start in range(len(words) - order + 1):
            gram = " ".join(words[start : start + order])
            counts[zlib.crc32(gram.encode()) % dim] += 1
    norm = math.sqrt(sum(count * count for count in counts.values()))
    return {index: count / norm for index, count in counts.items()} if norm else {}


def hashed_ngrams(text: str, dim: int = FEATURE_DIM, n: Sequence[int] = NGRAM_ORDERS) -> np.ndarray:
    """Counts of the lower-cased word n-grams (orders ``n``) hashed by crc32 into ``dim`` buckets,
    L2-normalised, float32.  Stable across processes (crc32, not ``hash()``); all zeros for a
    text without words."""
    vector = np.zeros(dim, dtype=np.float32)
    for index, weight in ngram_weights(text, dim, n).items():
        vector[index] = weight
    return vector


def precision_recall(router: ConfigRouter, space: ConfigSpace, examples: Iterable[LabelledInput]) -> RouterQuality:
    """Precision and recall over every (input, configuration) pair of ``examples``."""
    predicted = labelled = both = 0
    configs = list(range(space.size))
    for example in examples:
        answers = router.predict(space, example.text, configs)
        predicted_mask = sum(1 << config for config, accurate in zip(configs, answers, strict=True) if accurate)
        predicted += predicted_mask.bit_count()
        labelled += example.accurate.bit_count()
        both += (predicted_mask & example.accurate).bit_count()
    return RouterQuality(both / predicted if predicted else 1.0, both / labelled if labelled else 1.0)


class KnownSetsRouter:
    """Accurate sets known exactly: ``sets[text]`` is the input's mask.  An input it does not know
    keeps only the reference configuration."""

    def __init__(self, sets: Mapping[str, int]) -> None:
        self.sets = dict(sets)

    def predict(self, space: ConfigSpace, text: str, configs: Sequence[int]) -> list[bool]:
        mask = self.sets.get(text, 1 << space.reference)
        return [bool(mask >> config & 1) for config in configs]


@dataclass(frozen=True)
class InputClass:
    """One class of the offline profile: the configurations accurate on (nearly) all its inputs,
    by name, and the centroid of its inputs' features (sparse, L2-normalised)."""

    name: str
    accurate: tuple[str, ...]  # ConfigSpace.name of each configuration
    centroid: Mapping[int, float] = field(default_factory=dict)


class TableRouter:
    """Accurate sets per input class, from an offline profile (seeds/002 §3.1 with a lookup in
    place of trained routers).

    ``fit``: a configuration joins a class's set when it was accurate on at least ``quantile`` of
    the class's training inputs (default 0.95: a set is meant to keep accuracy, so a configuration
    that fails one input in twenty stays out; the reference is always in).  ``predict``: the input's
    class is the one whose centroid is nearest by cosine similarity; an input sharing no n-gram with
    any centroid keeps only the reference.

    Centroids keep their ``centroid_terms`` largest weights (default 256), rounded to 6 digits and
    renormalised, so that the profile stays small and predicts the same after ``to_dict`` and
    ``from_dict``.  Configurations are stored by name, so a profile works with any space whose
    agents come in the same order; names the space does not have are ignored.
    """

    def __init__(self, workflow_type: str, classes: Sequence[InputClass], dim: int = FEATURE_DIM,
                 ngram_orders: Sequence[int] = NGRAM_ORDERS) -> None:
        self.workflow_type = workflow_type
        self.classes = tuple(classes)
        self.dim = dim
        self.ngram_orders = tuple(ngram_orders)
        self._masks: dict[ConfigSpace, tuple[int, ...]] = {}

    @classmethod
    def fit(cls, space: ConfigSpace, examples: Sequence[LabelledInput], quantile: float = 0.95,
            centroid_terms: int = 256) -> TableRouter:
        if not examples:
            raise ValueError("a table router needs one or more labelled inputs")
        if not 0.0 < quantile <= 1.0:
            raise ValueError(f"quantile must be in (0, 1], got {quantile}")
        by_class: dict[str, list[LabelledInput]] = {}
        for example in examples:
            by_class.setdefault(example.input_class, []).append(example)
        classes = []
        for name in sorted(by_class):
            members = by_class[name]
            needed = quantile * len(members) - 1e-9
            accurate = [config for config in range(space.size)
                        if sum(example.accurate >> config & 1 for example in members) >= needed]
            centroid = np.mean([hashed_ngrams(example.text) for example in members], axis=0)
            classes.append(InputClass(name, tuple(space.name(config) for config in accurate),
                                      _sparse_top(centroid, centroid_terms)))
        return cls(space.workflow_type, classes)

    def classify(self, text: str) -> InputClass | None:
        """The class with the nearest centroid; None when no centroid shares an n-gram with ``text``
        (ties go to the first class, classes being sorted by name)."""
        position = self._nearest(text)
        return None if position is None else self.classes[position]

    def accurate_mask(self, space: ConfigSpace, text: str) -> int:
        position = self._nearest(text)
        if position is None:
            return 1 << space.reference
        return self._class_masks(space)[position]

    def _nearest(self, text: str) -> int | None:
        features = ngram_weights(text, self.dim, self.ngram_orders)
        best, best_similarity = None, 0.0
        for position, input_class in enumerate(self.classes):
            similarity = sum(weight * input_class.centroid.get(index, 0.0) for index, weight in features.items())
            if similarity > best_similarity:
                best, best_similarity = position, similarity
        return best

    def predict(self, space: ConfigSpace, text: str, configs: Sequence[int]) -> list[bool]:
        mask = self.accurate_mask(space, text)
        return [bool(mask >> config & 1) for config in configs]

    def _class_masks(self, space: ConfigSpace) -> tuple[int, ...]:
        masks = self._masks.get(space)
        if masks is None:
            by_name = {space.name(config): config for config in range(space.size)}
            masks = tuple(
                sum(1 << by_name[name] for name in set(input_class.accurate) if name in by_name) | 1 << space.reference
                for input_class in self.classes
            )
            self._masks[space] = masks
        return masks

    # ---- the profile file --------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able profile; centroids as parallel lists of indices and weights."""
        return {
            "kind": "table",
            "workflow_type": self.workflow_type,
            "features": {"dim": self.dim, "ngram_orders": list(self.ngram_orders)},
            "classes": [
                {
                    "name": input_class.name,
                    "accurate": list(input_class.accurate),
                    "centroid": {"indices": list(input_class.centroid), "weights": list(input_class.centroid.values())},
                }
                for input_class in self.classes
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TableRouter:
        """The router of a ``to_dict`` profile.  Raises ValueError naming what is malformed."""
        try:
            if data.get("kind") != "table":
                raise ValueError(f"expected kind 'table', got {data.get('kind')!r}")
            features = data["features"]
            classes = []
            for raw in data["classes"]:
                indices, weights = raw["centroid"]["indices"], raw["centroid"]["weights"]
                if len(indices) != len(weights):
                    raise ValueError(f"class {raw['name']!r}: centroid indices and weights differ in length")
                centroid = {int(index): float(weight) for index, weight in zip(indices, weights, strict=True)}
                classes.append(InputClass(str(raw["name"]), tuple(str(name) for name in raw["accurate"]), centroid))
            return cls(str(data["workflow_type"]), classes, int(features["dim"]),
                       tuple(int(order) for order in features["ngram_orders"]))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed table router profile: {exc!r}") from exc


def _sparse_top(vector: np.ndarray, terms: int) -> dict[int, float]:
    """The ``terms`` largest entries of ``vector``, rounded and renormalised, by index."""
    top = np.argsort(-vector, kind="stable")[:terms]
    top = top[vector[top] > 0]
    weights = vector[top].astype(np.float64)
    norm = float(np.linalg.norm(weights))
    if not norm:
        return {}
    return {int(index): round(float(weight) / norm, 6) for index, weight in zip(top, weights, strict=True)}
