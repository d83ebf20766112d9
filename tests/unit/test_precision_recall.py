"""Improved precision and recall (raydiff.evaluate.precision_recall) on constructed features."""

from __future__ import annotations

import numpy as np
import pytest

from raydiff.errors import UserInputError
from raydiff.evaluate.precision_recall import precision_recall

pytestmark = pytest.mark.unit


def manifold_coverage(points: np.ndarray, manifold: np.ndarray, k: int) -> float:
    """The paper's definition, written out: the fraction of ``points`` inside any ball around a
    ``manifold`` vector whose radius is that vector's distance to its k-th nearest neighbour in
    ``manifold`` (itself excluded)."""
    within = np.linalg.norm(manifold[:, None] - manifold[None], axis=-1)
    radii = np.sort(within, axis=1)[:, k]  # column 0 is the vector itself
    across = np.linalg.norm(points[:, None] - manifold[None], axis=-1)
    return float((across <= radii[None]).any(axis=1).mean())


def test_identical_sets_have_precision_and_recall_1() -> None:
    features = np.random.default_rng(0).normal(size=(64, 16))
    assert precision_recall(features, features) == (1.0, 1.0)


def test_disjoint_sets_have_precision_and_recall_0() -> None:
    features = np.random.default_rng(0).normal(size=(64, 16))
    assert precision_recall(features, features + 50.0) == (0.0, 0.0)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_partly_overlapping_sets_match_the_papers_definition(k: int) -> None:
    rng = np.random.default_rng(k)
    reference = rng.normal(size=(120, 8))
    samples = rng.normal(loc=0.8, scale=0.7, size=(90, 8))
    precision, recall = precision_recall(samples, reference, k=k)
    assert 0.0 < precision < 1.0 and 0.0 < recall < 1.0
    # torch-fidelity averages in float32: the same counts, to 1e-6 (each vector is 1/90 or 1/120).
    assert precision == pytest.approx(manifold_coverage(samples, reference, k), abs=1e-6)
    assert recall == pytest.approx(manifold_coverage(reference, samples, k), abs=1e-6)


def test_mode_collapse_keeps_precision_and_loses_recall() -> None:
    """Samples from a small part of the data are faithful (precision) but not diverse (recall)."""
    reference = np.random.default_rng(1).normal(size=(200, 4))
    collapsed = reference[np.linalg.norm(reference, axis=1) < 1.0][:30]
    precision, recall = precision_recall(collapsed, reference)
    assert precision == 1.0 and recall < 0.5


def test_bad_feature_sets_are_refused_naming_what_is_wrong() -> None:
    features = np.zeros((10, 4))
    with pytest.raises(UserInputError, match=r"more than 3 samples feature vectors .*\[3, 4\]"):
        precision_recall(features[:3], features)
    with pytest.raises(UserInputError, match="samples have 4-d features but the reference 5-d"):
        precision_recall(features, np.zeros((10, 5)))
    with pytest.raises(UserInputError, match="k=0 is invalid"):
        precision_recall(features, features, k=0)
