"""FID and KID of generated images against a reference set, on torch-fidelity.

The features are the standard FID Inception's (torch-fidelity's network, see
:mod:`raydiff.evaluate.inception`); the metrics are torch-fidelity's own functions on them:

- FID (Heusel et al. 2017): ``metric_fid.fid_features_to_statistics`` and
  ``fid_statistics_to_metric``, the Fréchet distance of the Gaussians fitted to the two sets.
- KID (Bińkowski et al. 2018): ``metric_kid.kid_features_to_metric``, the unbiased MMD² under the
  cubic polynomial kernel, mean and standard deviation over random subsets.

raydiff brings what torch-fidelity's ``calculate_metrics`` does not fit: its image sources
(:mod:`raydiff.data.image_sources`: sample npz files, image folders, prepared datasets, also
under URIs) and its reference cache in the dataset (:mod:`raydiff.evaluate.reference_cache`).
:func:`compute_fid` also reports improved precision and recall in the same features
(:mod:`raydiff.evaluate.precision_recall`). No Ray here.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch

from raydiff.data.image_sources import SOURCE_KINDS, load_images
from raydiff.errors import UserInputError
from raydiff.evaluate.inception import (
    DEFAULT_BATCH_SIZE,
    extract_features,
    import_torch_fidelity,
    load_inception,
)
from raydiff.evaluate.precision_recall import NEIGHBOURHOOD, precision_recall
from raydiff.evaluate.reference_cache import reference_features
from raydiff.storage import local_path

logger = logging.getLogger(__name__)

KID_SUBSETS = 100
"""torch-fidelity's default number of KID subsets."""
KID_SUBSET_SIZE = 1000
"""KID subset size (Bińkowski et al. 2018 and torch-fidelity use 1000); capped at N."""
KID_SEED = 2020
"""torch-fidelity's default ``rng_seed``: the same subsets as torch-fidelity's defaults."""
RESULT_KEYS = ("fid", "kid_mean", "kid_std", "precision", "recall", "num_samples", "num_reference")
"""What :func:`compute_fid` returns (and ``fid_SPLIT.json`` holds besides its sources)."""


def frechet_distance(features_a: np.ndarray, features_b: np.ndarray) -> float:
    """FID of two ``[N, D]`` feature sets (N >= 2 each), by torch-fidelity's ``metric_fid``."""
    for features in (features_a, features_b):
        if features.ndim != 2 or len(features) < 2:
            raise UserInputError(
                f"FID needs the features of at least 2 images, got {list(features.shape)}"
            )
    metric_fid = import_torch_fidelity().metric_fid
    statistics = [
        metric_fid.fid_features_to_statistics(torch.from_numpy(f.astype(np.float64)))
        for f in (features_a, features_b)
    ]
    return metric_fid.fid_statistics_to_metric(*statistics, verbose=False)[
        metric_fid.KEY_METRIC_FID
    ]


def kernel_inception_distance(
    features_a: np.ndarray,
    features_b: np.ndarray,
    *,
    num_subsets: int = KID_SUBSETS,
    subset_size: int = KID_SUBSET_SIZE,
    seed: int = KID_SEED,
) -> tuple[float, float]:
    """KID of two ``[N, D]`` feature sets: (mean, standard deviation) over ``num_subsets``
    subsets, by torch-fidelity's ``metric_kid``.

    Subsets of ``min(subset_size, N_a, N_b)`` images (torch-fidelity refuses fewer images than
    the subset size; raydiff evaluates small sample sets too), drawn from ``RandomState(seed)``,
    never the global NumPy RNG. Small negative values are valid: the estimate is unbiased.
    """
    if num_subsets < 1:
        raise UserInputError(f"num_subsets={num_subsets} is invalid: must be >= 1")
    size = min(subset_size, len(features_a), len(features_b))
    if size < 2:
        raise UserInputError(
            f"KID needs at least 2 images on each side, got {len(features_a)} and {len(features_b)}"
        )
    metric_kid = import_torch_fidelity().metric_kid
    result = metric_kid.kid_features_to_metric(
        torch.from_numpy(features_a.astype(np.float64)),
        torch.from_numpy(features_b.astype(np.float64)),
        kid_subsets=num_subsets,
        kid_subset_size=size,
        rng_seed=seed,
        verbose=False,
    )
    return result[metric_kid.KEY_METRIC_KID_MEAN], result[metric_kid.KEY_METRIC_KID_STD]


def compute_fid(
    *,
    samples: str | Path,
    reference: str | Path,
    split: str = "test",
    samples_split: str | None = None,
    inception: str | Path | None = None,
    num_images: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    extractor: torch.nn.Module | None = None,
    kid_subsets: int = KID_SUBSETS,
    kid_subset_size: int = KID_SUBSET_SIZE,
    progress: bool = False,
) -> dict[str, float | None]:
    """FID, KID, precision and recall of ``samples`` against ``reference``; what ``raydiff
    evaluate fid`` reports.

    ``samples`` / ``reference``: any source of :func:`load_images`; a prepared dataset
    contributes its ``split`` (``samples_split`` for the samples side, default ``split``), and
    a local one caches its reference features (:func:`reference_features`). ``num_images``: the
    first N images of each side (default all). ``extractor``: a feature network taking uint8
    ``[B, 3, H, W]`` (default: the FID Inception from ``inception``, see :func:`load_inception`,
    on CUDA when available). An injected extractor stays on its device.

    :return: ``fid``, ``kid_mean``, ``kid_std``, ``precision``, ``recall`` (k = 3; None with 3
        images or fewer on a side), ``num_samples``, ``num_reference``.
    """
    _check_arguments(
        samples=samples, reference=reference, num_images=num_images, batch_size=batch_size
    )
    if extractor is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        extractor = load_inception(inception, device=device)
    started = time.perf_counter()
    sample_images = load_images(samples, split=samples_split or split, limit=num_images)
    sample_features = extract_features(
        extractor, sample_images, batch_size=batch_size, progress=progress
    )
    ref_features, ref_shape = reference_features(
        reference, extractor=extractor, split=split, num_images=num_images,
        batch_size=batch_size, progress=progress,
    )  # fmt: skip
    _warn_about_the_sets(sample_images.shape[1:], ref_shape, sample_features, ref_features)
    kid = kernel_inception_distance(
        sample_features, ref_features, num_subsets=kid_subsets, subset_size=kid_subset_size
    )
    fid = frechet_distance(sample_features, ref_features)
    precision = recall = None  # k = 3 needs 4 images on each side
    if min(len(sample_features), len(ref_features)) > NEIGHBOURHOOD:
        precision, recall = precision_recall(sample_features, ref_features)
    values = (fid, *kid, precision, recall, len(sample_features), len(ref_features))
    logger.info(
        "%s %.4f, KID %.5f +- %.5f, precision/recall %s (%d samples, %d reference images, "
        "%.1f s)", getattr(extractor, "distance_name", "FID"), fid, *kid, "-" if precision is None else f"{precision:.3f}/{recall:.3f}",
        len(sample_features), len(ref_features), time.perf_counter() - started,
    )  # fmt: skip
    return dict(zip(RESULT_KEYS, values, strict=True))


def _check_arguments(
    *, samples: str | Path, reference: str | Path, num_images: int | None, batch_size: int
) -> None:
    """Refuse bad arguments before the 90 MB network loads: a typo should not wait for it."""
    if batch_size < 1:
        raise UserInputError(f"batch_size={batch_size} is invalid: must be >= 1")
    if num_images is not None and num_images < 1:
        raise UserInputError(f"num_images={num_images} is invalid: must be >= 1 (or None for all)")
    for role, source in (("samples", samples), ("reference", reference)):
        local = local_path(source)  # a URI's existence is checked when it is read
        if local is not None and not local.exists():
            raise UserInputError(f"{role} {source} does not exist; expected {SOURCE_KINDS}")


def _warn_about_the_sets(
    sample_shape: tuple[int, ...],
    reference_shape: tuple[int, ...],
    sample_features: np.ndarray,
    ref_features: np.ndarray,
) -> None:
    """Warn about a comparison that is defined but likely not what was meant."""
    if sample_shape != reference_shape:
        # Inception resizes both to 299x299 and grey is repeated to RGB, so the metric is
        # defined; but different sizes or channels usually mean the wrong reference.
        logger.warning(
            "samples are %s images but the reference images are %s (H, W, C); check that the "
            "reference is the data the model was trained on",
            "x".join(map(str, sample_shape)),
            "x".join(map(str, reference_shape)),
        )
    dims = sample_features.shape[1]
    if min(len(sample_features), len(ref_features)) < dims:
        logger.warning(
            "FID of %d samples and %d reference images with %d-d features: the covariances are "
            "rank-deficient and FID is biased upwards (published FIDs use 10k-50k images)",
            len(sample_features), len(ref_features), dims,
        )  # fmt: skip
