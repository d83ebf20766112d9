"""How a run's data order is seeded: which rows are flipped and how rows are shuffled per epoch.

Both data paths use these, so a seed means the same thing everywhere:

* flips are a hash of (seed, epoch, row index): independent of which worker, batch or shuffle
  a row lands in, identical for the Ray Data pipeline and the in-memory loader;
* shuffles are keyed by (seed, epoch) (and the rank, for a Ray worker's local shuffle buffer);
  the in-memory loader's permutation uses :func:`row_order_seed`.

Every seed comes from :func:`raydiff.seeding.derive_seed`. NumPy only: no torch, no Ray.
"""

from __future__ import annotations

import numpy as np

from raydiff.seeding import derive_seed


def flip_mask(index: np.ndarray, *, seed: int, epoch: int) -> np.ndarray:
    """Bool [B]: whether each row (by its index within its split) is flipped in ``epoch``."""
    base = np.uint64(derive_seed(seed, "flip", epoch, bits=64))
    with np.errstate(over="ignore"):  # splitmix64 of (row index, base): wrapping is intended
        z = np.asarray(index).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + base
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(63)).astype(bool)


def row_order_seed(*, seed: int, epoch: int) -> int:
    """Seed of the in-memory loader's row permutation in ``epoch``."""
    return derive_seed(seed, "order", epoch)


def shuffle_buffer_seed(*, seed: int, epoch: int, rank: int) -> int:
    """Seed of a Ray worker's local shuffle buffer in ``epoch`` (32 bits, as Ray Data takes)."""
    return derive_seed(seed, "shuffle", epoch, rank, bits=32)


def block_order_seed(seed: int) -> int:
    """Base seed of the per-epoch block / shard-file order (Ray mixes the epoch in itself)."""
    return derive_seed(seed, "blocks", bits=32)
