"""How a run's data order is seeded: which rows are flipped and how rows are shuffled per epoch.

Both data paths use these, so a seed means the same thing everywhere:

* flips are a hash of (seed, epoch, row index): independent of which worker, batch or shuffle
  a row lands in, identical for the Ray Data pipeline and the in-memory loader;
* a split held in memory (the in-memory loader, and the decoded cache of a Ray run) is read in
  one permutation per epoch, seeded by (seed, epoch) (:func:`row_order_seed`), cut into global
  batches; rank r of W takes the r-th of W equal slices of each (:func:`global_batch_rows`), so
  the global batches do not depend on the number of workers;
* a streamed split's rows are shuffled by each Ray worker's local shuffle buffer, keyed by
  (seed, epoch, rank);

* the block / shard-file order is Ray Data's, re-seeded by Ray per execution from the base seed
  :func:`block_order_seed` and the dataset's execution count; a resumed run's dataset starts
  that count at the resumed epoch (:func:`start_block_order_at`).

Every seed comes from :func:`raydiff.seeding.derive_seed`. NumPy only, but for the one Ray
function, which imports Ray when called: importing this module imports neither torch nor Ray.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from raydiff.errors import UserInputError
from raydiff.seeding import derive_seed

if TYPE_CHECKING:
    import ray.data


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


def epoch_permutation(num_rows: int, *, seed: int, epoch: int) -> np.ndarray:
    """The order (int64 row indices) in which a split held in memory is read in ``epoch``."""
    import torch

    generator = torch.Generator().manual_seed(row_order_seed(seed=seed, epoch=epoch))
    return torch.randperm(num_rows, generator=generator).numpy()


def global_batch_rows(
    num_rows: int,
    *,
    global_batch: int,
    rank: int = 0,
    world_size: int = 1,
    seed: int,
    start_epoch: int = 0,
    skip_batches: int = 0,
    num_epochs: int | None = None,
) -> Iterator[tuple[int, np.ndarray]]:
    """``(epoch, rows)``: this rank's rows of each global batch, forever by default.

    Each epoch's :func:`epoch_permutation` is cut into ``num_rows // global_batch`` global
    batches (the last partial one is dropped); rank ``r`` of ``world_size`` takes the slice
    ``[r * local, (r + 1) * local)`` of each, ``local = global_batch // world_size``. Which rows
    form a global batch depends on (seed, epoch, batch) only: a run that resumes on another
    number of workers (``skip_batches``: the global batches of ``start_epoch`` already trained
    on) trains on the batches the uninterrupted run would have.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} of world_size={world_size} is invalid")
    if global_batch % world_size:
        raise ValueError(f"global_batch={global_batch} does not split over {world_size} workers")
    if skip_batches < 0:
        raise ValueError(f"skip_batches={skip_batches} is invalid; valid values: integers >= 0")
    if num_rows < global_batch:
        raise UserInputError(
            f"the split has {num_rows} rows, fewer than one batch of {global_batch}"
        )
    local = global_batch // world_size
    epoch, first = start_epoch, skip_batches
    while num_epochs is None or epoch < start_epoch + num_epochs:
        order = epoch_permutation(num_rows, seed=seed, epoch=epoch)
        for start in range(first * global_batch, num_rows - global_batch + 1, global_batch):
            yield epoch, order[start + rank * local : start + (rank + 1) * local]
        first = 0  # a resumed position past the epoch's end starts the next epoch afresh
        epoch += 1


def shuffle_buffer_seed(*, seed: int, epoch: int, rank: int) -> int:
    """Seed of a Ray worker's local shuffle buffer in ``epoch`` (32 bits, as Ray Data takes)."""
    return derive_seed(seed, "shuffle", epoch, rank, bits=32)


def block_order_seed(seed: int) -> int:
    """Base seed of the per-epoch block / shard-file order (Ray mixes the epoch in itself)."""
    return derive_seed(seed, "blocks", bits=32)


def start_block_order_at(dataset: ray.data.Dataset, *, epoch: int) -> None:
    """Make the next execution of ``dataset`` (a new one) give the block / file order that the
    run's execution ``epoch`` had.

    Ray Data re-seeds a ``reseed_after_execution`` block or file order from (seed, the dataset's
    execution count), and counts a new dataset's executions from 0. Ray 2.60 has no public way to
    start that count elsewhere, nor to give an execution a seed of its own (Ray Train executes
    the one dataset it was given once per epoch), so a resumed run's new dataset would replay the
    orders of epochs 0, 1, ... and skip other rows than the ones it trained on. This moves Ray
    Data's private per-dataset counter, the one non-public Ray API raydiff uses; pyproject
    bounds Ray to the release it was verified on, and a probe of Ray's behaviour
    (:func:`_check_ray_block_order`, once per process) refuses a Ray that counts otherwise,
    naming its version, instead of training on another order.
    """
    _check_ray_block_order()
    _move_execution_counter(dataset, by=epoch)


def _move_execution_counter(dataset: Any, *, by: int) -> None:
    counter = getattr(dataset.context, "_execution_idx", None)
    if not isinstance(counter, int):
        _ray_changed("Ray Data's per-dataset execution counter is missing or not an int")
    dataset.context._execution_idx = counter + by


@functools.cache
def _check_ray_block_order() -> None:
    """Raise RuntimeError unless this Ray re-seeds a block order per execution and a new dataset
    whose execution counter was moved by k replays execution k's order (a 16-row dataset, five
    executions: about a second)."""
    executed = _probe_dataset()
    orders = [_rows(executed) for _ in range(3)]
    if len({tuple(order) for order in orders}) < 3:
        _ray_changed(
            "randomize_block_order(RandomSeedConfig(reseed_after_execution=True)) gave the same "
            "block order in two executions of one dataset"
        )
    for k in (1, 2):
        moved = _probe_dataset()
        _move_execution_counter(moved, by=k)
        if _rows(moved) != orders[k]:
            _ray_changed(
                f"a new dataset whose execution counter was moved by {k} does not replay the "
                f"block order of execution {k}"
            )


def _probe_dataset() -> ray.data.Dataset:
    import ray.data
    from ray.data import RandomSeedConfig

    dataset = ray.data.range(16, override_num_blocks=16).randomize_block_order(
        seed=RandomSeedConfig(seed=0, reseed_after_execution=True)
    )
    dataset.context.execution_options.preserve_order = True  # row order = block order
    return dataset


def _rows(dataset: ray.data.Dataset) -> list[int]:
    return [int(row["id"]) for row in dataset.take_all()]


def _ray_changed(problem: str) -> None:
    import ray

    raise RuntimeError(
        f"Ray {ray.__version__}: {problem}. raydiff starts a resumed run's block / file order at "
        "its epoch through this (verified on Ray 2.60); with this Ray the run would silently "
        "train on another order. Resume with the Ray raydiff supports (pip install "
        "'ray[default,train,tune,data]>=2.60,<2.61'), or set data.shuffle_blocks=false (no "
        "per-epoch block order to restore), and report it so that "
        "raydiff.data.order.start_block_order_at can be updated."
    )
