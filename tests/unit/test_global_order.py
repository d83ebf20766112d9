"""One per-epoch global order, each rank its slice: the global batches of any worker count."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from raydiff.data.order import global_batch_rows
from raydiff.errors import UserInputError

ROWS, GLOBAL = 50, 12  # 4 global batches per epoch, 2 rows dropped


def global_batches(world_size: int, *, steps: int, **kwargs: int) -> list[tuple[int, list[int]]]:
    """(epoch, rows) of each global batch: every rank's slice, concatenated in rank order."""
    ranks = [
        global_batch_rows(
            ROWS, global_batch=GLOBAL, rank=r, world_size=world_size, seed=7, **kwargs
        )
        for r in range(world_size)
    ]
    out = []
    for parts in itertools.islice(zip(*ranks, strict=True), steps):
        epochs = {epoch for epoch, _ in parts}
        assert len(epochs) == 1, "ranks disagree on the epoch"
        assert all(len(rows) == GLOBAL // world_size for _, rows in parts)
        out.append((epochs.pop(), np.concatenate([rows for _, rows in parts]).tolist()))
    return out


def test_the_global_batches_do_not_depend_on_the_worker_count() -> None:
    one = global_batches(1, steps=12)
    for world_size in (2, 3, 4, 6):
        assert global_batches(world_size, steps=12) == one
    for epoch in range(3):
        rows = [r for e, batch in one if e == epoch for r in batch]
        assert len(rows) == len(set(rows)) == 4 * GLOBAL  # no row twice in an epoch
    assert [e for e, _ in one] == [0] * 4 + [1] * 4 + [2] * 4
    assert one[0][1] != one[4][1]  # reshuffled per epoch


def test_a_run_resized_mid_epoch_continues_with_the_uninterrupted_batches() -> None:
    # 2 workers train 6 global batches (epoch 1 after 2 of its batches); 3 workers continue.
    uninterrupted = global_batches(2, steps=12)
    resumed = global_batches(3, steps=6, start_epoch=1, skip_batches=2)
    assert uninterrupted[:6] + resumed == uninterrupted
    # A position past the epoch's end starts the next epoch.
    assert global_batches(4, steps=1, start_epoch=0, skip_batches=9) == uninterrupted[4:5]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="global_batch=12 does not split over 5 workers"):
        next(global_batch_rows(ROWS, global_batch=12, world_size=5, seed=0))
    with pytest.raises(ValueError, match="rank=2 of world_size=2"):
        next(global_batch_rows(ROWS, global_batch=12, rank=2, world_size=2, seed=0))
    with pytest.raises(ValueError, match="skip_batches=-1"):
        next(global_batch_rows(ROWS, global_batch=12, seed=0, skip_batches=-1))
    with pytest.raises(UserInputError, match="50 rows, fewer than one batch of 64"):
        next(global_batch_rows(ROWS, global_batch=64, seed=0))
