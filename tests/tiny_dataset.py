"""The tiny prepared dataset of the tiers that train on Ray (integration, cluster): 16x16x1, 10
classes, 288 train and 32 val rows in 16-row shards, made from an .npz whose pixel (0, 0) holds
the class id (tests check labels against pixels). Many small shards give many blocks, so
block-order shuffling is visible. Importable from every test module, as tiny_model.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class TinyDataset:
    """What :func:`make_tiny_dataset` made (tests read these instead of repeating them)."""

    path: Path
    image_size: int = 16
    channels: int = 1
    num_classes: int = 10
    num_train: int = 288  # 288 train + 32 val: both split evenly over 2 workers and batch 16
    num_val: int = 32


def make_tiny_dataset(root: Path) -> TinyDataset:
    """The dataset prepared into ``root / "dataset"`` (its source: ``root / "tiny.npz"``)."""
    from raydiff.data import PrepareOptions, prepare_dataset

    tiny = TinyDataset(path=root / "dataset")
    num_images = tiny.num_train + tiny.num_val
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (num_images, tiny.image_size, tiny.image_size), np.uint8)
    labels = np.arange(num_images) % tiny.num_classes
    images[:, 0, 0] = labels
    np.savez(root / "tiny.npz", images, labels)
    prepare_dataset(
        PrepareOptions(
            source=str(root / "tiny.npz"),
            out=str(tiny.path),
            image_size=tiny.image_size,
            channels=tiny.channels,
            val_count=tiny.num_val,
            shard_max_rows=16,
            num_workers=1,
            progress=False,
        )
    )
    return tiny
