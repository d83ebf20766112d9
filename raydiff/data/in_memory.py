"""Load a whole prepared split into memory as tensors (single-process runs, tests, evaluation).

The Ray Data pipeline (``raydiff.data.pipeline``) is the way to feed distributed training; this
is the simple path for data that fits in RAM on one machine, with no Ray involved.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch

from raydiff.data.encode import decode_png
from raydiff.data.manifest import Manifest, load_manifest
from raydiff.data.order import flip_mask, global_batch_rows
from raydiff.errors import UserInputError

logger = logging.getLogger(__name__)


def load_split_tensors(
    uri: str, split: str = "train", *, limit: int | None = None, manifest: Manifest | None = None
) -> tuple[torch.Tensor, torch.Tensor | None, list[str]]:
    """Decode ``split`` of the prepared dataset at ``uri`` (whose ``manifest`` the caller may
    have read already).

    :return: ``(x, y, class_names)``: x float32 ``[N, C, H, W]`` in [-1, 1] (improved-diffusion's
        ``x / 127.5 - 1``), y int64 ``[N]`` or None for unlabelled data.
    """
    manifest = manifest or load_manifest(uri)
    pixels, labels = read_split_pixels(manifest, split, limit=limit)
    x = torch.from_numpy(pixels.transpose(0, 3, 1, 2).astype(np.float32) / 127.5 - 1)
    y = torch.from_numpy(labels)
    has_labels = bool((y >= 0).all()) and bool(manifest.classes)
    size, channels = manifest.image_size, manifest.channels
    logger.info("loaded %d %s images of %dx%dx%d from %s", len(x), split, size, size, channels, uri)
    return x, (y if has_labels else None), list(manifest.classes or [])


def read_split_pixels(
    manifest: Manifest, split: str, *, limit: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The images of ``split`` as uint8 ``[N, H, W, C]`` and their labels as int64 ``[N]``
    (``-1`` for unlabelled rows), in shard order; ``limit``: the first N rows only.

    Reads no shard past the one that reaches ``limit``. Raises ``UserInputError`` for a split
    the dataset does not have, or one with no images.
    """
    size, channels = manifest.image_size, manifest.channels
    pixels: list[np.ndarray] = []
    labels: list[int] = []
    for shard in manifest.shard_uris(split):
        if limit is not None and len(pixels) >= limit:
            break
        table = pq.read_table(shard, columns=["png", "label", "key"])
        for png, label, key in zip(
            table.column("png").to_pylist(),
            table.column("label").to_pylist(),
            table.column("key").to_pylist(),
            strict=True,
        ):
            if limit is not None and len(pixels) >= limit:
                break
            pixels.append(decode_png(png, image_size=size, channels=channels, key=key))
            labels.append(label)
    if not pixels:
        raise UserInputError(f"split {split!r} of the dataset at {manifest.root} has no images")
    return np.stack(pixels), np.asarray(labels, dtype=np.int64)


def infinite_batches(
    images: torch.Tensor,
    labels: torch.Tensor | None,
    *,
    batch_size: int,
    seed: int,
    start_epoch: int = 0,
    skip_batches: int = 0,
    random_flip: bool = True,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """In-memory training data: ``(epoch, batch)`` forever, reshuffled every epoch.

    ``batch`` is what the Ray Data pipeline's batches hold: ``x`` float32 ``[B, C, H, W]``,
    ``index`` int64 ``[B]`` (rows of the split) and ``y`` int64 ``[B]`` when ``labels`` are given.
    The order (:func:`raydiff.data.order.global_batch_rows`) and the flips are those of a Ray
    run's decoded cache (:mod:`raydiff.data.cached_split`): a row's flip depends on (seed, epoch,
    row) only. With ``random_flip`` (``data.random_flip``)
    each image is flipped horizontally with probability 1/2, as guided-diffusion's loader does
    (improved-diffusion's never flips). ``start_epoch`` and ``skip_batches`` (batches of the first
    epoch already trained on) continue a resumed run exactly where it stopped; the last partial
    batch of an epoch is dropped, as on Ray.
    """
    for epoch, rows in global_batch_rows(
        images.shape[0],
        global_batch=batch_size,
        seed=seed,
        start_epoch=start_epoch,
        skip_batches=skip_batches,
    ):
        idx = torch.from_numpy(rows)
        x = images[idx]
        if random_flip:
            flip = torch.from_numpy(flip_mask(rows, seed=seed, epoch=epoch))
            x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
        batch: dict[str, Any] = {"x": x, "index": idx}
        if labels is not None:
            batch["y"] = labels[idx]
        yield epoch, batch
