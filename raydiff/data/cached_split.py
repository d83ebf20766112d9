"""A training split held decoded in Ray's object store, read in one global order per epoch.

The driver decodes a split that fits ``data.cache_max_bytes`` once (Ray Data, on any CPU of the
cluster) and keeps its rows as numpy blocks in the object store (:meth:`CachedSplit.from_dataset`).
Every worker maps those blocks read-only (``ray.get`` of numpy arrays is zero-copy: one copy of
the split per node, whatever its number of workers) and gathers its batches from them.

The order is the in-memory loader's (:func:`raydiff.data.order.global_batch_rows`): one
permutation of the split per epoch, seeded by (seed, epoch), cut into global batches; rank r of
W takes the r-th of W equal slices of each. The global batches therefore do not depend on the
number of workers: a run resumed on another number (an elastic resize, a restart on the nodes
that are left) trains on exactly the batches the uninterrupted run would have, with no example
of the epoch repeated or skipped. Flips and normalisation are the streamed pipeline's
(:func:`raydiff.data.collate.collate_rows`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from raydiff.data.collate import collate_rows
from raydiff.data.config import DataConfig
from raydiff.data.order import global_batch_rows

if TYPE_CHECKING:
    import ray
    import ray.data

CACHED_COLUMNS = ["image", "label", "index", "key"]


@dataclass
class CachedSplit:
    """A decoded split as numpy blocks in the object store (it pickles as references: pass it
    to the workers in ``train_loop_config``)."""

    blocks: list[ray.ObjectRef]
    num_rows: int
    _rows: _Rows | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_dataset(cls, dataset: ray.data.Dataset) -> CachedSplit:
        """Decoded rows (``raydiff.data.pipeline``'s columns) -> numpy blocks in the store."""
        dataset = dataset.select_columns(CACHED_COLUMNS).materialize()
        return cls(blocks=dataset.to_numpy_refs(), num_rows=dataset.count())

    def __getstate__(self) -> dict[str, Any]:
        # The references only: each process maps the blocks itself.
        return {"blocks": self.blocks, "num_rows": self.num_rows, "_rows": None}

    def batches(
        self,
        *,
        global_batch: int,
        config: DataConfig,
        rank: int = 0,
        world_size: int = 1,
        epoch_start: int = 0,
        skip_batches: int = 0,
        num_epochs: int | None = None,
        with_keys: bool = False,
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        """``(epoch, batch)``: this rank's share of each global batch, forever by default.

        ``batch`` is what :func:`raydiff.data.pipeline.iterate_batches` gives (``x``, ``index``,
        ``y`` with ``config.class_cond``, ``key`` with ``with_keys``), of
        ``global_batch // world_size`` rows. ``skip_batches``: global batches of ``epoch_start``
        already trained on (at any worker count).
        """
        rows = self._load()
        for epoch, ids in global_batch_rows(
            self.num_rows,
            global_batch=global_batch,
            rank=rank,
            world_size=world_size,
            seed=config.seed,
            start_epoch=epoch_start,
            skip_batches=skip_batches,
            num_epochs=num_epochs,
        ):
            yield (
                epoch,
                collate_rows(
                    rows.gather(ids, with_keys=with_keys),
                    seed=config.seed,
                    epoch=epoch,
                    random_flip=config.random_flip,
                    class_cond=config.class_cond,
                    with_keys=with_keys,
                ),
            )

    def _load(self) -> _Rows:
        if self._rows is None:
            import ray

            self._rows = _Rows(ray.get(self.blocks), num_rows=self.num_rows)
        return self._rows


class _Rows:
    """The blocks in this process, and where each row (by its ``index`` in the split) lies."""

    def __init__(self, blocks: list[dict[str, np.ndarray]], *, num_rows: int) -> None:
        self.blocks = blocks
        self.block_of = np.full(num_rows, -1, dtype=np.int64)
        self.offset_of = np.empty(num_rows, dtype=np.int64)
        for b, block in enumerate(blocks):
            index = np.asarray(block["index"], dtype=np.int64)
            if len(index) and (index.min() < 0 or index.max() >= num_rows):
                raise ValueError(f"row indices outside [0, {num_rows}) in the cached split")
            self.block_of[index] = b
            self.offset_of[index] = np.arange(len(index))
        if (self.block_of < 0).any():
            missing = int((self.block_of < 0).sum())
            raise ValueError(
                f"{missing} of the split's {num_rows} row indices are missing from its cached "
                "blocks: its shards' index column must number the rows 0..N-1 (raydiff prepare)"
            )

    def gather(self, ids: np.ndarray, *, with_keys: bool) -> dict[str, np.ndarray]:
        """The rows ``ids`` in that order: ``image``, ``label``, ``index`` (and ``key``)."""
        first = self.blocks[0]
        image = np.empty((len(ids), *first["image"].shape[1:]), dtype=first["image"].dtype)
        label = np.empty(len(ids), dtype=np.int64)
        key = np.empty(len(ids), dtype=object) if with_keys else None
        where, offsets = self.block_of[ids], self.offset_of[ids]
        for b in np.unique(where):
            mask = where == b
            block = self.blocks[b]
            image[mask] = block["image"][offsets[mask]]
            label[mask] = block["label"][offsets[mask]]
            if key is not None:
                key[mask] = block["key"][offsets[mask]]
        batch = {"image": image, "label": label, "index": ids}
        if key is not None:
            batch["key"] = key
        return batch
