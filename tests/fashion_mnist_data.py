"""The machine's Fashion-MNIST, prepared small for the tests that train on real images.
Importable from every test module (pytest puts ``tests/`` on ``sys.path``)."""

from __future__ import annotations

from pathlib import Path

import pytest


def fashion_mnist_at(out: Path, *, image_size: int, limit: int, val_count: int) -> Path:
    """The machine's Fashion-MNIST prepared at ``image_size`` (its first ``limit`` images,
    ``val_count`` of them as val) into ``out``; the test skips where the dataset is missing
    (under CI a skip of a ``dataset`` test is an error: tests/conftest.py)."""
    from raydiff.data import PrepareOptions, prepare_dataset
    from raydiff.data.sources import FASHION_MNIST_DIR

    if not (Path(FASHION_MNIST_DIR) / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"no Fashion-MNIST at {FASHION_MNIST_DIR}")
    prepare_dataset(
        PrepareOptions(
            source="fashion-mnist",
            out=str(out),
            image_size=image_size,
            limit=limit,
            val_count=val_count,
            num_workers=1,
        )
    )
    return out
