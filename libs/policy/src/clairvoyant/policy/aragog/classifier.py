"""Aragog's trained configuration router: one binary classifier per configuration (seeds/002 §3.1).

The seed embeds the input once (Arctic-Embed) and runs a small MLP per configuration on the
embedding, fusing the MLPs layer by layer into one kernel.  Here, without a model download:

- The embedding is ``hashed_ngrams`` projected onto the leading singular directions of the
  training texts (a truncated SVD, ``embedding_dim`` 64 by default) and standardised, so that every
  configuration's classifier reads the same few dozen numbers.
- Each configuration gets an ``MLPClassifier`` with one hidden layer of 64 units (the seed uses six
  hidden layers on a 1024-wide embedding; a shallow net suits features this size and training sets
  of hundreds).  A configuration whose training labels are all one class gets a constant answer.
- A false positive costs accuracy and a false negative only flexibility, so each classifier's
  decision threshold is the lowest probability that still reaches ``target_precision`` (0.95) on a
  held-out quarter of the examples; a classifier that cannot reach it there never says accurate.
  The classifiers are trained on the other three quarters.
- ``FusedClassifiers`` runs every asked configuration's first layer as one matrix product over the
  stacked weights, and the further layers as one batched product each.

Measured on a shared 2-core CPU (3**5 space, 64-wide embedding, one BLAS thread), ``predict`` for
one input whose embedding is cached: 1 configuration 19 us, 27: 81 us, 81: 140 us, 243: 194 us;
embedding a new text adds 30-80 us.  A batch costs little more than a single call, so the pruned
search (fewer configurations, more calls) saves router calls but not time over one exhaustive call
here: 1.5 ms against 0.7 ms per input.  Multi-threaded BLAS on busy cores made the 243-batch
vary from 0.2 to 8 ms; a scheduler process should run with one BLAS thread.

A profile (``dumps``) is a pickle of plain numpy arrays and names: a trusted operator file, never
read from a request.
"""

from __future__ import annotations

import logging
import pickle
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import sparse
from scipy.special import expit
from sklearn.decomposition import TruncatedSVD
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPClassifier

from clairvoyant.core.configspace import ConfigSpace
from clairvoyant.policy.aragog.routers import FEATURE_DIM, NGRAM_ORDERS, LabelledInput, ngram_weights

logger = logging.getLogger(__name__)

PROFILE_FORMAT = "clairvoyant.aragog.classifier/1"


class TextEmbedding:
    """Hashed n-grams -> ``(features @ projection.T - mean) / scale``: the routers' shared input."""

    def __init__(self, projection: np.ndarray, mean: np.ndarray, scale: np.ndarray,
                 dim: int = FEATURE_DIM, ngram_orders: Sequence[int] = NGRAM_ORDERS) -> None:
        self.projection = projection.astype(np.float32)  # (embedding, dim)
        self.mean = mean.astype(np.float32)
        self.scale = scale.astype(np.float32)
        self.dim, self.ngram_orders = dim, tuple(ngram_orders)

    @classmethod
    def fit(cls, texts: Sequence[str], embedding_dim: int, seed: int) -> TextEmbedding:
        features = _feature_matrix(texts, FEATURE_DIM, NGRAM_ORDERS)
        components = max(1, min(embedding_dim, features.shape[0] - 1, FEATURE_DIM - 1))
        svd = TruncatedSVD(n_components=components, random_state=seed).fit(features)
        projected = features @ svd.components_.T
        scale = projected.std(axis=0)
        return cls(svd.components_, projected.mean(axis=0), np.where(scale > 1e-6, scale, 1.0))

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        """One row per text, float32."""
        rows = np.zeros((len(texts), self.projection.shape[0]), dtype=np.float32)
        for row, text in enumerate(texts):
            weights = ngram_weights(text, self.dim, self.ngram_orders)
            if weights:
                indices = np.fromiter(weights, dtype=np.int64, count=len(weights))
                values = np.fromiter(weights.values(), dtype=np.float32, count=len(weights))
                rows[row] = self.projection[:, indices] @ values
        return (rows - self.mean) / self.scale


class FusedClassifiers:
    """The MLPs of many configurations, stacked layer by layer (one ReLU network per row, logistic
    output).  ``layers[0]`` holds every configuration's first layer side by side, so that one matrix
    product computes them all::

        weights[0]: (inputs, configs * hidden)     x @ weights[0] -> (texts, configs * hidden)
        weights[l]: (configs, hidden_in, hidden_out)  batched per configuration
        weights[-1]: (configs, hidden_last, 1)         -> (texts, configs) logits
    """

    def __init__(self, weights: Sequence[np.ndarray], biases: Sequence[np.ndarray]) -> None:
        self.weights = [w.astype(np.float32) for w in weights]
        self.biases = [b.astype(np.float32) for b in biases]
        self.configs = self.biases[-1].shape[0]
        self.first_hidden = self.biases[0].shape[0] // self.configs

    @classmethod
    def stack(cls, networks: Sequence[MLPClassifier]) -> FusedClassifiers:
        """Stack trained binary ``MLPClassifier``s of one architecture (ReLU, logistic output)."""
        for network in networks:
            if network.activation != "relu" or network.out_activation_ != "logistic":
                raise ValueError("fusion needs ReLU hidden layers and a logistic output")
        depth = len(networks[0].coefs_)
        first = np.stack([network.coefs_[0] for network in networks], axis=1)  # (inputs, configs, hidden)
        weights = [first.reshape(first.shape[0], -1)]
        biases = [np.concatenate([network.intercepts_[0] for network in networks])]
        for layer in range(1, depth):
            weights.append(np.stack([network.coefs_[layer] for network in networks]))
            biases.append(np.stack([network.intercepts_[layer] for network in networks]))
        return cls(weights, biases)

    def probabilities(self, inputs: np.ndarray, rows: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """(texts, len(rows)) probabilities of the classifiers ``rows`` (all when None)."""
        picked = np.arange(self.configs) if rows is None else np.asarray(rows, dtype=np.int64)
        if len(picked) * 4 > self.configs:  # most of them: one product over all, then pick
            hidden = inputs @ self.weights[0]
            hidden += self.biases[0]
            hidden = hidden.reshape(len(inputs), self.configs, -1)
            if rows is not None:
                hidden = hidden[:, picked, :]
        else:  # a few: gather their columns first
            first = self.weights[0].reshape(self.weights[0].shape[0], self.configs, self.first_hidden)[:, picked, :]
            hidden = inputs @ first.reshape(first.shape[0], -1)
            hidden += self.biases[0].reshape(self.configs, -1)[picked].ravel()
            hidden = hidden.reshape(len(inputs), len(picked), -1)
        activations = np.maximum(hidden, 0.0, out=hidden)
        for layer in range(1, len(self.weights)):
            # (texts, configs, h_in) x (configs, h_in, h_out) -> (texts, configs, h_out)
            activations = np.einsum("tci,cio->tco", activations, self.weights[layer][picked]) + self.biases[layer][picked]
            if layer < len(self.weights) - 1:
                activations = np.maximum(activations, 0.0)
        return np.asarray(expit(activations[:, :, 0]))


class ClassifierRouter:
    """Binary routers per configuration over a shared embedding; see the module docstring."""

    def __init__(self, workflow_type: str, config_names: Sequence[str], embedding: TextEmbedding,
                 classifiers: FusedClassifiers, thresholds: np.ndarray) -> None:
        if not len(config_names) == classifiers.configs == len(thresholds):
            raise ValueError("one classifier and one threshold per configuration name")
        self.workflow_type = workflow_type
        self.config_names = tuple(config_names)
        self.embedding, self.classifiers = embedding, classifiers
        self.thresholds = np.asarray(thresholds, dtype=np.float64)  # +inf: never accurate, -inf: always
        self._rows: dict[ConfigSpace, np.ndarray] = {}
        self._last: tuple[str, np.ndarray] | None = None

    @classmethod
    def fit(cls, space: ConfigSpace, examples: Sequence[LabelledInput], target_precision: float = 0.95,
            seed: int = 0, hidden: Sequence[int] = (64,), embedding_dim: int = 64,
            calibration_share: float = 0.25, max_iter: int = 400) -> ClassifierRouter:
        if len(examples) < 4:
            raise ValueError("a classifier router needs four or more labelled inputs")
        order = np.random.default_rng(seed).permutation(len(examples))
        held_out = max(1, round(len(examples) * calibration_share))
        calibration, training = order[:held_out], order[held_out:]
        embedding = TextEmbedding.fit([examples[i].text for i in training], embedding_dim, seed)
        inputs = embedding([example.text for example in examples])
        labels = np.array([[example.accurate >> config & 1 for config in range(space.size)] for example in examples])
        networks, thresholds = [], np.empty(space.size)
        for config in range(space.size):
            network = MLPClassifier(hidden_layer_sizes=tuple(hidden), max_iter=max_iter, random_state=seed)
            seen = labels[training, config]
            if seen.min() == seen.max():  # one class only: a constant answer on zero weights
                network = _constant_network(network, inputs.shape[1])
                thresholds[config] = -np.inf if seen[0] else np.inf
            else:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", ConvergenceWarning)
                    network.fit(inputs[training], seen)
                if caught:
                    logger.debug("classifier of %s stopped at max_iter=%d", space.name(config), max_iter)
                probabilities = network.predict_proba(inputs[calibration])[:, 1]
                thresholds[config] = precision_threshold(probabilities, labels[calibration, config], target_precision)
            networks.append(network)
        names = [space.name(config) for config in range(space.size)]
        return cls(space.workflow_type, names, embedding, FusedClassifiers.stack(networks), thresholds)

    def probabilities(self, space: ConfigSpace, text: str, configs: Sequence[int]) -> np.ndarray:
        """Each configuration's probability of being accurate (NaN for one the profile lacks)."""
        rows = self._rows_of(space)[np.asarray(configs, dtype=np.int64)]
        known = rows >= 0
        result = np.full(len(rows), np.nan)
        if known.any():
            result[known] = self.classifiers.probabilities(self._embed(text), rows[known])[0]
        return result

    def predict(self, space: ConfigSpace, text: str, configs: Sequence[int]) -> list[bool]:
        """A configuration the profile does not name is never accurate."""
        if not len(configs):
            return []
        rows = self._rows_of(space)[np.asarray(configs, dtype=np.int64)]
        accurate = np.zeros(len(rows), dtype=bool)
        known = rows >= 0
        if known.any():
            probabilities = self.classifiers.probabilities(self._embed(text), rows[known])[0]
            accurate[known] = probabilities >= self.thresholds[rows[known]]
        return accurate.tolist()

    def _embed(self, text: str) -> np.ndarray:
        """The embedding, computed once per text: the search asks about one input several times."""
        last = self._last
        if last is None or last[0] != text:
            last = (text, self.embedding([text]))
            self._last = last
        return last[1]

    def _rows_of(self, space: ConfigSpace) -> np.ndarray:
        rows = self._rows.get(space)
        if rows is None:
            position = {name: row for row, name in enumerate(self.config_names)}
            rows = np.array([position.get(space.name(config), -1) for config in range(space.size)], dtype=np.int64)
            self._rows[space] = rows
        return rows

    # ---- the profile file --------------------------------------------------------------------

    def dumps(self) -> bytes:
        return pickle.dumps({
            "format": PROFILE_FORMAT,
            "workflow_type": self.workflow_type,
            "config_names": list(self.config_names),
            "features": {"dim": self.embedding.dim, "ngram_orders": list(self.embedding.ngram_orders)},
            "embedding": {"projection": self.embedding.projection, "mean": self.embedding.mean,
                          "scale": self.embedding.scale},
            "weights": self.classifiers.weights,
            "biases": self.classifiers.biases,
            "thresholds": self.thresholds,
        })

    @classmethod
    def loads(cls, data: bytes) -> ClassifierRouter:
        """The router of a ``dumps`` profile (trusted input: this unpickles).  Raises ValueError."""
        try:
            raw: dict[str, Any] = pickle.loads(data)  # noqa: S301 - an operator's own profile file
            if raw.get("format") != PROFILE_FORMAT:
                raise ValueError(f"expected format {PROFILE_FORMAT!r}, got {raw.get('format')!r}")
            embedding = TextEmbedding(raw["embedding"]["projection"], raw["embedding"]["mean"],
                                      raw["embedding"]["scale"], raw["features"]["dim"], raw["features"]["ngram_orders"])
            classifiers = FusedClassifiers(raw["weights"], raw["biases"])
            return cls(raw["workflow_type"], raw["config_names"], embedding, classifiers, raw["thresholds"])
        except (pickle.UnpicklingError, EOFError, ImportError, KeyError, TypeError, AttributeError, IndexError) as exc:
            raise ValueError(f"malformed classifier router profile: {exc!r}") from exc


def precision_threshold(probabilities: np.ndarray, labels: np.ndarray, target: float) -> float:
    """The lowest threshold whose positives (probability >= threshold) reach precision ``target``
    on these labelled held-out answers; +inf when none does."""
    order = np.argsort(-probabilities, kind="stable")
    ranked, hits = probabilities[order], labels[order].astype(np.float64)
    precision = np.cumsum(hits) / np.arange(1, len(ranked) + 1)
    cut_here = np.append(ranked[1:] < ranked[:-1], True)  # never split equal probabilities
    reachable = np.flatnonzero(cut_here & (precision >= target))
    return float(ranked[reachable[-1]]) if len(reachable) else float("inf")


def _constant_network(network: MLPClassifier, inputs: int) -> MLPClassifier:
    """``network`` with zero weights of its architecture (its answer comes from the threshold)."""
    sizes = [inputs, *network.hidden_layer_sizes, 1]
    network.coefs_ = [np.zeros((a, b)) for a, b in zip(sizes[:-1], sizes[1:], strict=True)]
    network.intercepts_ = [np.zeros(b) for b in sizes[1:]]
    network.out_activation_ = "logistic"
    return network


def _feature_matrix(texts: Sequence[str], dim: int, orders: Sequence[int]) -> sparse.csr_matrix:
    rows, columns, values = [], [], []
    for row, text in enumerate(texts):
        for column, value in ngram_weights(text, dim, orders).items():
            rows.append(row)
            columns.append(column)
            values.append(value)
    return sparse.csr_matrix((values, (rows, columns)), shape=(len(texts), dim), dtype=np.float64)
