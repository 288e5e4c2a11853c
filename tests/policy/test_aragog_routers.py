"""Aragog's configuration routers (seeds/002 §3.1): the hashed n-gram features, the known-sets and
table routers, the classifier router with its fused inference, and precision/recall."""

from __future__ import annotations

import json
import random
import zlib

import numpy as np
import pytest
from sklearn.neural_network import MLPClassifier

from clairvoyant.core.configspace import ConfigSpace
from clairvoyant.policy.aragog.classifier import ClassifierRouter, FusedClassifiers, precision_threshold
from clairvoyant.policy.aragog.pruning import exhaustive_search, prune_search
from clairvoyant.policy.aragog.routers import (
    KnownSetsRouter,
    LabelledInput,
    TableRouter,
    hashed_ngrams,
    precision_recall,
)

pytestmark = pytest.mark.unit

MODELS = ("small", "medium", "large")
SPACE = ConfigSpace("self_refine", ("generate", "critique", "refine"), (MODELS, MODELS, MODELS))
FILLER = [f"word{i}" for i in range(150)]


def topic_words(difficulty: int) -> list[str]:
    return [f"topic{difficulty}x{i}" for i in range(12)]


def labelled_inputs(space: ConfigSpace, count: int, seed: int) -> list[LabelledInput]:
    """Inputs of a hidden difficulty 0..max: some filler words and some of the difficulty's own
    words; a configuration is accurate when its strength (the sum of its option levels) reaches
    the difficulty, so the labels are monotone and the class is the difficulty."""
    rng = random.Random(seed)
    strongest = sum(len(options) - 1 for options in space.options)
    examples = []
    for _ in range(count):
        difficulty = rng.randint(0, strongest)
        words = rng.sample(FILLER, 8) + rng.sample(topic_words(difficulty), 4)
        rng.shuffle(words)
        accurate = sum(1 << c for c in range(space.size) if sum(space.levels(c)) >= difficulty)
        examples.append(LabelledInput(" ".join(words), f"difficulty{difficulty}", accurate))
    return examples


# ---- features --------------------------------------------------------------------------------


def test_hashed_ngrams_counts_word_unigrams_and_bigrams_in_crc32_buckets() -> None:
    vector = hashed_ngrams("Hello  hello, World", dim=2**16)
    assert vector.dtype == np.float32 and vector.shape == (2**16,)
    expected = np.zeros(2**16)
    for gram, count in [("hello", 2), ("world", 1), ("hello hello", 1), ("hello world", 1)]:
        expected[zlib.crc32(gram.encode()) % 2**16] += count
    np.testing.assert_allclose(vector, expected / np.linalg.norm(expected), rtol=1e-6)
    assert float(np.linalg.norm(vector)) == pytest.approx(1.0)


def test_hashed_ngrams_orders_and_empty_text() -> None:
    assert not hashed_ngrams("  ,, !").any()
    unigrams = hashed_ngrams("a b", n=(1,))
    assert np.count_nonzero(unigrams) == 2
    np.testing.assert_array_equal(unigrams, hashed_ngrams("b a", n=(1,)))
    assert not np.array_equal(hashed_ngrams("a b"), hashed_ngrams("b a"))  # the bigram differs


# ---- known sets ----------------------------------------------------------------------------


def test_known_sets_router_reads_the_bit_and_keeps_only_the_reference_for_an_unknown_input() -> None:
    router = KnownSetsRouter({"easy": 0b110, "hard": 1 << SPACE.reference})
    assert router.predict(SPACE, "easy", [0, 1, 2, 26]) == [False, True, True, False]
    assert router.predict(SPACE, "unseen", list(range(SPACE.size))) == [c == SPACE.reference for c in range(SPACE.size)]


def test_precision_recall_over_input_configuration_pairs() -> None:
    space = ConfigSpace("w", ("a",), (("s", "m", "l"),))
    router = KnownSetsRouter({"x": 0b110, "y": 0b100})
    examples = [LabelledInput("x", "c", 0b111), LabelledInput("y", "c", 0b010)]
    # predicted {1,2} and {2}; labelled {0,1,2} and {1}: 2 of 3 predictions right, 2 of 4 found
    assert precision_recall(router, space, examples) == (2 / 3, 2 / 4)
    assert precision_recall(KnownSetsRouter({}), space, []) == (1.0, 1.0)


# ---- table router --------------------------------------------------------------------------


def test_table_router_learns_each_class_set_and_classifies_unseen_inputs() -> None:
    training, unseen = labelled_inputs(SPACE, 300, seed=1), labelled_inputs(SPACE, 100, seed=2)
    router = TableRouter.fit(SPACE, training)
    assert [c.name for c in router.classes] == [f"difficulty{d}" for d in range(7)]
    for input_class in router.classes:
        difficulty = int(input_class.name.removeprefix("difficulty"))
        assert {SPACE.config_of(dict(zip(SPACE.agents, n.split("+"), strict=True))) for n in input_class.accurate} == {
            c for c in range(SPACE.size) if sum(SPACE.levels(c)) >= difficulty}
    assert precision_recall(router, SPACE, unseen) == (1.0, 1.0)
    assert router.accurate_mask(SPACE, "nothing in common") == 1 << SPACE.reference


def test_table_router_quantile_keeps_out_a_configuration_that_fails_too_often() -> None:
    space = ConfigSpace("w", ("a",), (("s", "m", "l"),))
    # 19 inputs accurate on everything, one only on the reference: 'm' and 's' hold on 95 %.
    examples = [LabelledInput(f"same text {i}", "only", 0b111) for i in range(19)]
    examples.append(LabelledInput("same text odd", "only", 0b100))
    assert TableRouter.fit(space, examples, quantile=0.95).classes[0].accurate == ("s", "m", "l")
    assert TableRouter.fit(space, examples, quantile=1.0).classes[0].accurate == ("l",)
    # The reference is in every set, labelled or not.
    never = [LabelledInput("same text", "only", 0b001)]
    assert TableRouter.fit(space, never).accurate_mask(space, "same text") == 0b101


def test_table_profile_round_trips_through_json_and_stays_small() -> None:
    training, unseen = labelled_inputs(SPACE, 300, seed=1), labelled_inputs(SPACE, 60, seed=3)
    router = TableRouter.fit(SPACE, training)
    text = json.dumps(router.to_dict())
    assert len(text) < 40_000  # seven classes of at most 256 centroid terms
    loaded = TableRouter.from_dict(json.loads(text))
    for example in unseen:
        assert loaded.accurate_mask(SPACE, example.text) == router.accurate_mask(SPACE, example.text)
    with pytest.raises(ValueError, match="malformed"):
        TableRouter.from_dict({"kind": "table", "workflow_type": "w"})
    with pytest.raises(ValueError, match="kind"):
        TableRouter.from_dict({"kind": "classifier"})


def test_table_profile_resolves_names_in_a_space_with_the_same_agent_order() -> None:
    router = TableRouter.fit(SPACE, labelled_inputs(SPACE, 200, seed=1))
    # A space where 'critique' may also run on 'tiny': every index moves, names stay.
    wider = ConfigSpace("self_refine", SPACE.agents, (MODELS, ("tiny", *MODELS), MODELS))
    for example in labelled_inputs(SPACE, 30, seed=4):
        names = {SPACE.name(c) for c in SPACE.members(router.accurate_mask(SPACE, example.text))}
        assert {wider.name(c) for c in wider.members(router.accurate_mask(wider, example.text))} == names


# ---- classifier router ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def classifier() -> ClassifierRouter:
    return ClassifierRouter.fit(SPACE, labelled_inputs(SPACE, 400, seed=1), seed=0)


def test_classifier_router_is_precise_on_unseen_inputs(classifier: ClassifierRouter) -> None:
    quality = precision_recall(classifier, SPACE, labelled_inputs(SPACE, 150, seed=5))
    print(f"classifier router on unseen inputs: precision {quality.precision:.3f}, recall {quality.recall:.3f}")
    assert quality.precision >= 0.9 and quality.recall >= 0.7


def test_classifier_gives_constant_answers_where_training_labels_are_one_class(classifier: ClassifierRouter) -> None:
    # The reference is accurate on every input, the base only on difficulty 0.
    assert classifier.thresholds[SPACE.reference] == -np.inf
    assert classifier.predict(SPACE, "no known words at all", [SPACE.reference]) == [True]
    never = ClassifierRouter.fit(SPACE, [LabelledInput(f"text {i}", "c", 1 << SPACE.reference) for i in range(8)])
    assert never.predict(SPACE, "text 1", list(range(SPACE.size))) == [c == SPACE.reference for c in range(SPACE.size)]


def test_pruned_search_over_the_classifier_keeps_only_what_its_routers_say(classifier: ClassifierRouter) -> None:
    saved = 0
    for example in labelled_inputs(SPACE, 40, seed=6):
        pruned = prune_search(SPACE, classifier, example.text)
        everything = exhaustive_search(SPACE, classifier, example.text)
        assert pruned.verified() & ~everything.verified() == 0
        saved += everything.calls - pruned.calls
    assert saved > 0


def test_classifier_profile_round_trips(classifier: ClassifierRouter) -> None:
    loaded = ClassifierRouter.loads(classifier.dumps())
    configs = list(range(SPACE.size))
    for example in labelled_inputs(SPACE, 20, seed=7):
        assert loaded.predict(SPACE, example.text, configs) == classifier.predict(SPACE, example.text, configs)
        np.testing.assert_array_equal(loaded.probabilities(SPACE, example.text, configs),
                                      classifier.probabilities(SPACE, example.text, configs))
    with pytest.raises(ValueError, match="malformed"):
        ClassifierRouter.loads(b"not a pickle")


def test_classifier_answers_false_for_a_configuration_its_profile_does_not_name(classifier: ClassifierRouter) -> None:
    wider = ConfigSpace("self_refine", SPACE.agents, (MODELS, ("tiny", *MODELS), MODELS))
    text = labelled_inputs(SPACE, 1, seed=8)[0].text
    tiny = wider.config_of({"generate": "large", "critique": "tiny", "refine": "large"})
    assert classifier.predict(wider, text, [tiny, wider.reference]) == [False, True]
    assert np.isnan(classifier.probabilities(wider, text, [tiny])[0])


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # a few epochs suffice here
@pytest.mark.parametrize("hidden", [(8,), (6, 5)], ids=str)
def test_fused_inference_equals_sklearn_predict_proba(hidden: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(60, 10)).astype(np.float32)
    networks = []
    for k in range(12):
        labels = (inputs[:, k % 10] + rng.normal(scale=0.5, size=60) > 0).astype(int)
        networks.append(MLPClassifier(hidden_layer_sizes=hidden, max_iter=50, random_state=k).fit(inputs, labels))
    fused = FusedClassifiers.stack(networks)
    expected = np.stack([network.predict_proba(inputs)[:, 1] for network in networks], axis=1)
    np.testing.assert_allclose(fused.probabilities(inputs), expected, rtol=1e-4, atol=1e-6)
    for rows in ([3], [11, 0, 5], list(range(12))[::-1]):  # a few (gathered) and most (one product)
        np.testing.assert_allclose(fused.probabilities(inputs, rows), expected[:, rows], rtol=1e-4, atol=1e-6)


def test_precision_threshold_is_the_lowest_that_reaches_the_target() -> None:
    probabilities = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    labels = np.array([1, 1, 0, 1, 1, 0])
    # top-k precision: 1, 1, 2/3, 3/4, 4/5, 4/6
    assert precision_threshold(probabilities, labels, 0.95) == 0.8
    assert precision_threshold(probabilities, labels, 0.8) == 0.5
    assert precision_threshold(probabilities, np.zeros(6), 0.95) == float("inf")
    # equal probabilities are never split: both in or both out
    assert precision_threshold(np.array([0.9, 0.9, 0.1]), np.array([1, 0, 0]), 0.95) == float("inf")
