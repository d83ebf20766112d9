"""Improved precision and recall (Kynkäänniemi et al. 2019) of generated images, on torch-fidelity.

Each set's manifold is estimated as the union of balls around its feature vectors, each ball's
radius the distance to that vector's k-th nearest neighbour in its own set (k = 3, as in the paper
and in guided-diffusion's evaluator). Then

- precision = the fraction of generated vectors inside the real manifold (fidelity),
- recall = the fraction of real vectors inside the generated manifold (diversity).

The computation is torch-fidelity's (``metric_prc``); raydiff checks the inputs and gives it
NumPy features. The features come from any extractor: the FID Inception's, or another network's
penultimate layer. No Ray here.
"""

from __future__ import annotations

import numpy as np
import torch

from raydiff.errors import UserInputError
from raydiff.evaluate.inception import import_torch_fidelity

NEIGHBOURHOOD = 3
"""k of the k-nearest-neighbour radii (Kynkäänniemi et al. 2019; guided-diffusion's evaluator)."""
BATCH_SIZE = 1_000
"""Rows of the pairwise distance matrices computed at a time: a block is BATCH_SIZE x N float64
(400 MB for N = 50,000 samples; torch-fidelity's default of 10,000 would take 4 GB)."""


def precision_recall(
    samples: np.ndarray, reference: np.ndarray, *, k: int = NEIGHBOURHOOD
) -> tuple[float, float]:
    """(precision, recall) of ``samples`` against ``reference``, two ``[N, D]`` feature sets.

    Each set needs more than ``k`` vectors: a vector's k-th neighbour in its own set (itself
    excluded) defines its ball. Distances are Euclidean, in float64.
    """
    if k < 1:
        raise UserInputError(f"k={k} is invalid: must be >= 1")
    for role, features in (("samples", samples), ("reference", reference)):
        if features.ndim != 2 or len(features) <= k:
            raise UserInputError(
                f"precision and recall with k={k} need more than {k} {role} feature vectors "
                f"[N, D], got shape {list(features.shape)}"
            )
    if samples.shape[1] != reference.shape[1]:
        raise UserInputError(
            f"samples have {samples.shape[1]}-d features but the reference {reference.shape[1]}-d:"
            " they must come from the same extractor"
        )
    metric_prc = import_torch_fidelity().metric_prc
    # torch-fidelity's convention: features_1 are the generated ones, features_2 the real ones.
    precision, recall = metric_prc.calculate_precision_recall_part(
        torch.from_numpy(samples.astype(np.float64)),
        torch.from_numpy(reference.astype(np.float64)),
        neighborhood=k,
        batch_size=BATCH_SIZE,
    )
    return float(precision), float(recall)
