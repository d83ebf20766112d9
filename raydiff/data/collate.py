"""Decoded rows -> a training batch: the epoch's flips, then normalisation to [-1, 1]. The one
collation of both loaders (a streamed split's Ray Data batches and a cached split's slices)."""

from __future__ import annotations

from typing import Any

import numpy as np

from raydiff.data.order import flip_mask


def normalise(image: np.ndarray) -> np.ndarray:
    """uint8 -> float32 in [-1, 1], improved-diffusion's exact arithmetic (``x / 127.5 - 1``)."""
    return image.astype(np.float32) / 127.5 - 1


def collate_rows(
    batch: dict[str, np.ndarray],
    *,
    seed: int,
    epoch: int,
    random_flip: bool,
    class_cond: bool,
    with_keys: bool,
) -> dict[str, Any]:
    """Decoded rows (``image`` uint8 [B, C, H, W], ``index``, ``label``, ``key``) -> the training
    batch: ``epoch``'s flips, then normalisation to float32 torch tensors."""
    import torch

    image = batch["image"]
    index = batch["index"]
    if random_flip:
        # Flip the uint8 pixels: a quarter of the bytes of flipping floats.
        flip = flip_mask(index, seed=seed, epoch=epoch)
        image = np.where(flip[:, None, None, None], image[..., ::-1], image)
    # New arrays throughout: Arrow-backed batches are read-only, torch wants writable.
    out: dict[str, torch.Tensor | list[str]] = {
        "x": torch.from_numpy(normalise(image)),
        "index": torch.from_numpy(np.array(index, dtype=np.int64)),
    }
    if class_cond:
        out["y"] = torch.from_numpy(np.array(batch["label"], dtype=np.int64))
    if with_keys:
        out["key"] = [str(k) for k in batch["key"]]
    return out
