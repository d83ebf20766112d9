"""Reference features of FID/KID, and their cache in a prepared dataset.

Inception features of a 10k-image split cost minutes on a CPU, and the reference of an
evaluation never changes: a local prepared dataset keeps them in ``<dataset>/fid_reference/``.
torch-fidelity's own cache does not fit: it is keyed by a name the caller makes up, lives in one
folder per user, and cannot tell that a dataset was prepared again under the same path. Features
are cached rather than FID statistics, as KID needs the features. No Ray here.
"""

from __future__ import annotations

import io
import logging
import zipfile
from pathlib import Path

import numpy as np
import torch

from raydiff.data.image_sources import load_images
from raydiff.data.manifest import is_dataset, load_manifest
from raydiff.evaluate.inception import DEFAULT_BATCH_SIZE, extract_features, extractor_id
from raydiff.storage import local_path, write_bytes_atomically

logger = logging.getLogger(__name__)

REFERENCE_CACHE_DIR = "fid_reference"
"""Folder inside a prepared dataset that holds its cached reference features."""


def reference_features(
    reference: str | Path,
    *,
    extractor: torch.nn.Module,
    split: str = "test",
    num_images: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False,
) -> tuple[np.ndarray, tuple[int, ...]]:
    """Features of the reference images and their image shape ``(H, W, C)``.

    For a local prepared dataset they are cached in
    ``<dataset>/fid_reference/<split>_<n-images>_<extractor-id>.npz`` (written atomically) and
    read back on the next call: Inception features of a 10k-image split cost minutes on a CPU,
    and the reference of an evaluation never changes. A re-prepared dataset is a new folder
    (prepare replaces it whole), so its cache goes with it; the manifest's creation time is
    checked too. Other references (npz, image folders, remote datasets) are not cached.
    """
    local = local_path(reference)
    if local is None or not is_dataset(local):
        images = load_images(reference, split=split, limit=num_images)
        features = extract_features(extractor, images, batch_size=batch_size, progress=progress)
        return features, images.shape[1:]

    manifest = load_manifest(str(local))
    manifest.check_split(split)
    available = manifest.splits[split].num_rows
    num = available if num_images is None else min(num_images, available)
    cache = (
        Path(manifest.root) / REFERENCE_CACHE_DIR / f"{split}_{num}_{extractor_id(extractor)}.npz"
    )
    cached = _read_cache(cache, num_images=num, created_utc=manifest.created_utc)
    if cached is not None:
        logger.info("using cached reference statistics %s (%d images)", cache, num)
        return cached

    images = load_images(local, split=split, limit=num)
    features = extract_features(extractor, images, batch_size=batch_size, progress=progress)
    try:
        _write_cache(
            cache,
            features=features,
            image_shape=images.shape[1:],
            split=split,
            created_utc=manifest.created_utc,
        )
        logger.info("cached the reference features of %d images in %s", len(features), cache)
    except OSError as error:  # a read-only dataset: evaluate all the same
        logger.warning("could not cache the reference features in %s: %s", cache, error)
    return features, images.shape[1:]


def _read_cache(
    path: Path, *, num_images: int, created_utc: str
) -> tuple[np.ndarray, tuple[int, ...]] | None:
    """The cached ``(features, image_shape)``, or None when absent, unreadable or stale."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as archive:
            features = archive["features"].astype(np.float64)
            image_shape = tuple(int(d) for d in archive["image_shape"])
            stored_created = str(archive["created_utc"])
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
        logger.warning("ignoring the unreadable reference cache %s: %s", path, error)
        return None
    if stored_created != created_utc or features.ndim != 2 or len(features) != num_images:
        logger.warning("ignoring the stale reference cache %s", path)
        return None
    return features, image_shape


def _write_cache(
    path: Path,
    *,
    features: np.ndarray,
    image_shape: tuple[int, ...],
    split: str,
    created_utc: str,
) -> None:
    """Write atomically (:func:`~raydiff.storage.write_bytes_atomically`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # float32 when lossless (Inception's features are float32): half the size of float64.
    as_float32 = features.astype(np.float32)
    stored = as_float32 if np.array_equal(as_float32, features) else features
    buffer = io.BytesIO()
    np.savez(
        buffer,
        features=stored,
        image_shape=np.asarray(image_shape, dtype=np.int64),
        split=np.asarray(split),
        created_utc=np.asarray(created_utc),
    )
    write_bytes_atomically(path, buffer.getvalue())
