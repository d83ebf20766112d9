"""Load a whole prepared split into memory as tensors (single-process runs, tests, evaluation).

The Ray Data pipeline (``raydiff.data.pipeline``) is the way to feed distributed training; this
is the simple path for data that fits in RAM on one machine, with no Ray involved.
"""

from __future__ import annotations

import io
import logging

import numpy as np
import pyarrow.parquet as pq
import torch
from PIL import Image

from raydiff.data.manifest import load_manifest

logger = logging.getLogger(__name__)


def load_split_tensors(
    uri: str, split: str = "train", *, limit: int | None = None
) -> tuple[torch.Tensor, torch.Tensor | None, list[str]]:
    """Decode ``split`` of the prepared dataset at ``uri``.

    :return: ``(x, y, class_names)``: x float32 ``[N, C, H, W]`` in [-1, 1] (improved-diffusion's
        ``x / 127.5 - 1``), y int64 ``[N]`` or None for unlabelled data.
    """
    manifest = load_manifest(uri)
    if split not in manifest.splits:
        raise ValueError(
            f"dataset {uri} has no split {split!r}; its splits: {', '.join(manifest.splits)}"
        )
    size, channels = manifest.image_size, manifest.channels
    pixels, labels = [], []
    for shard in manifest.shard_uris(split):
        table = pq.read_table(shard, columns=["png", "label"])
        for png in table.column("png").to_pylist():
            with Image.open(io.BytesIO(png)) as image:
                pixels.append(np.asarray(image).reshape(size, size, channels))
        labels.extend(table.column("label").to_pylist())
        if limit is not None and len(pixels) >= limit:
            break
    if limit is not None:
        pixels, labels = pixels[:limit], labels[:limit]
    array = np.stack(pixels).transpose(0, 3, 1, 2)  # [N, C, H, W]
    x = torch.from_numpy(array.astype(np.float32) / 127.5 - 1)
    y = torch.tensor(labels, dtype=torch.int64)
    has_labels = bool((y >= 0).all()) and bool(manifest.classes)
    logger.info("loaded %d %s images of %dx%dx%d from %s", len(x), split, size, size, channels, uri)
    return x, (y if has_labels else None), list(manifest.classes or [])
