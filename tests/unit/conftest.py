"""Unit tier: one intra-op thread. The tensors here are tiny; with two threads every parallel op
waits for a second core, which on a busy 2-core machine makes a 3 s tier take 40 s."""

import numpy as np
import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_prepared(tmp_path_factory):
    """A prepared 8x8x1 dataset (train and val splits)."""
    from raydiff.data import PrepareOptions, prepare_dataset

    tmp_path = tmp_path_factory.mktemp("prepared")
    rng = np.random.default_rng(0)
    npz = tmp_path / "tiny.npz"
    np.savez(npz, rng.integers(0, 256, (24, 8, 8, 1), dtype=np.uint8), np.arange(24) % 3)
    out = tmp_path / "data"
    prepare_dataset(PrepareOptions(source=str(npz), out=str(out), image_size=8, channels=1))
    return out
