"""The Ray Data input pipeline: Parquet shards -> decoded, normalised batches on every worker.

Driver side, ``build_datasets`` reads the shards (local paths or ``s3://``/``gs://`` URIs) and
decodes the PNGs to uint8 NCHW arrays in ``map_batches`` on any CPU of the cluster. Pixels stay
uint8 until the last step: a cache holds 4x more images than float32 would, and the object store
moves 4x fewer bytes per epoch. A training split that fits ``cache_max_bytes`` is decoded once
into the object store as a :class:`raydiff.data.cached_split.CachedSplit`, read by every worker
in one global order per epoch (the same global batches at any number of workers). A larger one
is streamed: the Ray Train trainer (``datasets=...``) gives every worker an equal streaming shard
(``streaming_split(world_size, equal=True)``), and ``iterate_batches`` turns it into an endless
``(epoch, batch)`` stream. Each epoch re-executes the dataset, and its order changes in three
seeded places:

* the shard-file order (``read_parquet(shuffle=FileShuffleConfig)``), re-seeded per execution by
  Ray from (seed, execution index): the run's epochs are consecutive executions of the dataset,
  and a resumed run's dataset starts counting where the uninterrupted run's count stood at the
  resumed epoch (``epoch_offset``);
* the rows, through each worker's local shuffle buffer seeded by (seed, epoch, rank);
* the horizontal flips, a hash of (seed, epoch, row index): independent of which worker or
  batch a row lands in (the cached path flips the same way, :func:`raydiff.data.collate.collate_rows`).

A streamed split's batches depend on the number of workers (which rows reach which worker is
Ray's dynamic split): a run resumed on another number continues at the same position (the
epoch, and the number of global batches of it already trained on) but not with the same rows,
so the rest of that epoch may repeat some of the examples trained on before the restart and miss
as many others; every later epoch is again a full pass. The worker's collate function (in Ray's
batch-formatting threads, off the training loop) flips and normalises to float32 ``[-1, 1]``.

With ``deterministic=True`` Ray Data keeps its output order, so the same seed gives the same
batches every run. Ray and torch are imported inside the functions: importing this module
(and ``raydiff.data``) stays Ray-free for the unit tier.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from raydiff.data.cached_split import CachedSplit
from raydiff.data.collate import collate_rows
from raydiff.data.config import DataConfig
from raydiff.data.manifest import Manifest, check_compatible, load_manifest
from raydiff.data.order import (
    block_order_seed,
    shuffle_buffer_seed,
    start_block_order_at,
)
from raydiff.data.shards import SHARD_SCHEMA
from raydiff.errors import UserInputError
from raydiff.storage import reader_paths

if TYPE_CHECKING:
    import ray.data

logger = logging.getLogger(__name__)


def decoded_bytes(manifest: Manifest, split: str) -> int:
    """Object-store bytes of ``split`` once decoded to uint8 (what the cache budget counts)."""
    rows = manifest.splits[split].num_rows
    return rows * manifest.channels * manifest.image_size**2


def execution_options(config: DataConfig) -> ray.data.ExecutionOptions:
    """Ray Data execution options for the training shards.

    Pass them to ``ray.train.DataConfig(execution_options=...)``: Train replaces each dataset's
    execution options with its own defaults otherwise, dropping ``preserve_order``.
    """
    from ray.data import DataContext, ExecutionOptions

    current = DataContext.get_current().execution_options
    return ExecutionOptions(
        resource_limits=current.resource_limits,
        preserve_order=config.deterministic,
        verbose_progress=current.verbose_progress,
    )


def build_datasets(
    config: DataConfig,
    *,
    manifest: Manifest | None = None,
    epoch_offset: int = 0,
    cached: dict[str, ray.data.Dataset | CachedSplit] | None = None,
) -> dict[str, ray.data.Dataset | CachedSplit]:
    """A run's splits: ``{"train": ..., "val": ...}``.

    ``train`` is a :class:`CachedSplit` when it fits ``config.cache_max_bytes`` (decoded once
    here; the workers read it in one global order per epoch), else a streamed Ray dataset for
    the trainer (``datasets=...``), as ``val`` always is. ``val`` is left out when ``config.val_split`` is empty or the dataset has no such split.
    Raises ValueError (before any worker starts) when the manifest does not match the config.
    ``epoch_offset``: the epoch a resumed run starts at, when the driver knows it. Ray counts
    executions from 0 for every new dataset, so without it a resumed streamed run would replay
    the file orders of epochs 0, 1, ... (its row shuffles and flips still follow the true epoch);
    with it the resumed epoch has the uninterrupted run's order. ``cached``: splits already decoded into
    the object store by :func:`cache_splits` (a sweep decodes once for all its trials).
    """
    manifest = manifest or load_manifest(config.data_dir)
    check_compatible(
        manifest,
        image_size=config.image_size,
        channels=config.channels,
        class_cond=config.class_cond,
    )
    manifest.check_split(config.train_split, setting="data.train_split")
    cached = cached or {}
    # Validation first, as in cache_splits (_decode_val_first says why).
    val = None
    if config.val_split and config.val_split in manifest.splits:
        val = build_split(
            manifest,
            split=config.val_split,
            config=config,
            train=False,
            cached=cached.get(config.val_split),
        )
    elif config.val_split:
        logger.warning(
            "no %r split in %s: validation is off (splits: %s)",
            config.val_split,
            manifest.root,
            ", ".join(manifest.splits),
        )
    train = cached.get(config.train_split)
    if train is None and _cacheable(manifest, config.train_split, config):
        train = CachedSplit.from_dataset(
            _decode(manifest, split=config.train_split, config=config, file_shuffle=None)
        )
    datasets: dict[str, ray.data.Dataset | CachedSplit] = {
        "train": train
        if isinstance(train, CachedSplit)
        else build_split(
            manifest,
            split=config.train_split,
            config=config,
            train=True,
            epoch_offset=epoch_offset,
        )
    }
    if val is not None:
        datasets["val"] = val
    return datasets


def cache_splits(
    config: DataConfig, *, manifest: Manifest
) -> dict[str, ray.data.Dataset | CachedSplit]:
    """The splits a run reads (train, val) that fit ``config.cache_max_bytes``, decoded once
    into the object store: pass them to :func:`build_datasets` (``cached=``) of every run that
    reads the same dataset. Their owner (this process) must outlive those runs."""
    cached: dict[str, ray.data.Dataset | CachedSplit] = {}
    for split in _decode_val_first(config):
        if split in manifest.splits and _cacheable(manifest, split, config):
            decoded = _decode(manifest, split=split, config=config, file_shuffle=None)
            train = split == config.train_split
            cached[split] = CachedSplit.from_dataset(decoded) if train else decoded.materialize()
    return cached


def _decode_val_first(config: DataConfig) -> list[str]:
    """The splits a run reads, in the order the driver decodes them: validation first.

    The training split's cache ends in conversion tasks (``CachedSplit.from_dataset``) that
    run on after it returns, outside Ray Data's resource limits, on every CPU of a small
    cluster; a dataset executed right then has Ray Data warn that the cluster "does not have
    any available CPUs" and "will hang" (it does not). Decoded first, the small validation
    split starts on an idle cluster, and nothing in the driver executes a dataset after the
    training split's."""
    return [*([config.val_split] if config.val_split else []), config.train_split]


def _cacheable(manifest: Manifest, split: str, config: DataConfig) -> bool:
    return 0 < decoded_bytes(manifest, split) <= config.cache_max_bytes


def _decode(
    manifest: Manifest, *, split: str, config: DataConfig, file_shuffle: Any
) -> ray.data.Dataset:
    logger.info(
        "%s split %r (%.0f MiB decoded; cache budget %.0f MiB)",
        "decoding and caching" if _cacheable(manifest, split, config) else "streaming",
        split,
        decoded_bytes(manifest, split) / 2**20,
        config.cache_max_bytes / 2**20,
    )
    dataset = _read_shards(manifest.shard_uris(split), shuffle=file_shuffle).map_batches(
        decode_batch,
        fn_kwargs={"image_size": manifest.image_size, "channels": manifest.channels},
        batch_size=config.decode_batch_size,
        batch_format="numpy",
        zero_copy_batch=True,
    )
    # Before any execution, the cache's materialize included: without it the cached blocks come
    # in whichever order the decode tasks finish, and a seeded block order permutes a different
    # list every time (a resumed run would then skip other rows than the ones it trained on).
    dataset.context.execution_options.preserve_order = config.deterministic
    return dataset


def build_split(
    manifest: Manifest,
    *,
    split: str,
    config: DataConfig,
    train: bool,
    epoch_offset: int = 0,
    cached: ray.data.Dataset | None = None,
) -> ray.data.Dataset:
    """One split as a decoded Ray dataset (columns ``image``, ``label``, ``index``, ``key``).

    ``train=True``: the training split streamed, its shard-file order re-seeded per epoch (a
    training split that fits the cache is a :class:`CachedSplit` instead, :func:`build_datasets`).
    Validation data keeps its order, cached when it fits ``config.cache_max_bytes``; ``cached``:
    this split as :func:`cache_splits` decoded it.
    """
    from ray.data import FileShuffleConfig

    reorder = train and config.shuffle_blocks
    if cached is not None:
        dataset = cached
    else:
        # reseed_after_execution: Ray mixes the execution index (the epoch) into the seed.
        file_shuffle = (
            FileShuffleConfig(seed=block_order_seed(config.seed), reseed_after_execution=True)
            if reorder
            else None
        )
        dataset = _decode(manifest, split=split, config=config, file_shuffle=file_shuffle)
        if not train and _cacheable(manifest, split, config):
            dataset = dataset.materialize()
    dataset.context.execution_options.preserve_order = config.deterministic
    if reorder and epoch_offset:
        # A resumed run builds a new dataset, whose executions Ray counts from 0: start its
        # block / file order at the resumed epoch (raydiff.data.order), so that skip_batches
        # drops exactly the batches already trained on.
        start_block_order_at(dataset, epoch=epoch_offset)
    return dataset


def _read_shards(uris: list[str], *, shuffle: Any) -> ray.data.Dataset:
    """``read_parquet`` over the shard files listed in the manifest.

    Ray 2.60's default (V2) Parquet reader plans a single read task for all shards of a small
    dataset (one 59k-row block for Fashion-MNIST: no read parallelism, no block order left to
    shuffle) and spends ~5 s listing files. The V1 reader gives one read task per shard, split
    into a few blocks each, so it is selected for this call only.
    """
    import ray.data

    context = ray.data.DataContext.get_current()
    use_v2 = getattr(context, "use_datasource_v2", None)
    if use_v2 is not None:
        context.use_datasource_v2 = False
    paths, filesystem = reader_paths(uris)
    try:
        return ray.data.read_parquet(
            paths, columns=SHARD_SCHEMA.names, shuffle=shuffle, filesystem=filesystem
        )
    finally:
        if use_v2 is not None:
            context.use_datasource_v2 = use_v2


def decode_batch(
    batch: dict[str, np.ndarray], *, image_size: int, channels: int
) -> dict[str, np.ndarray]:
    """PNG bytes -> uint8 ``image`` [B, C, H, W] (runs in Ray Data tasks)."""
    from raydiff.data.encode import decode_png

    pngs = batch["png"]
    pixels = np.empty((len(pngs), image_size, image_size, channels), dtype=np.uint8)  # [B,H,W,C]
    for i, png in enumerate(pngs):
        pixels[i] = decode_png(
            png, image_size=image_size, channels=channels, key=str(batch["key"][i])
        )
    image = np.ascontiguousarray(pixels.transpose(0, 3, 1, 2))  # [B, C, H, W]
    return {"image": image, "label": batch["label"], "index": batch["index"], "key": batch["key"]}


def iterate_batches(
    shard: ray.data.DataIterator | ray.data.Dataset,
    *,
    batch_size: int,
    config: DataConfig,
    epoch_start: int = 0,
    num_epochs: int | None = None,
    rank: int = 0,
    train: bool = True,
    with_keys: bool = False,
    skip_batches: int = 0,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(epoch, batch)`` from a worker's shard, forever by default.

    ``batch`` holds ``x`` (float32 [B, C, H, W] in [-1, 1]), ``y`` (int64 [B], only with
    ``config.class_cond``), ``index`` (int64 [B], the rows' ids within their split) and, with
    ``with_keys``, ``key`` (list of source keys). ``batch_size`` is per worker.

    Training (``train=True``) drops the last partial batch, so every rank of an equal split
    takes the same number of steps per epoch, shuffles, flips, and repeats; ``epoch_start``
    resumes the epoch count (and the (seed, epoch) streams) of a restarted run. Validation
    (``train=False``) keeps every row, in order, unflipped, for one epoch unless told otherwise.
    ``skip_batches`` drops that many batches at the start of the first epoch: a run resumed in
    the middle of ``epoch_start`` continues at its position (the skipped batches are read, which
    is cheap next to a training step, not trained on).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} is invalid; valid values: integers >= 1")
    if skip_batches < 0:
        raise ValueError(f"skip_batches={skip_batches} is invalid; valid values: integers >= 0")
    to_skip = skip_batches
    if not train and num_epochs is None:
        num_epochs = 1
    epoch = epoch_start
    while num_epochs is None or epoch < epoch_start + num_epochs:
        shuffle_rows = train and config.shuffle_buffer_size > 0
        collate = _collate_class()(
            seed=config.seed,
            epoch=epoch,
            random_flip=train and config.random_flip,
            class_cond=config.class_cond,
            with_keys=with_keys,
        )
        num_batches = 0
        for batch in shard.iter_torch_batches(
            batch_size=batch_size,
            prefetch_batches=config.prefetch_batches,
            drop_last=train,
            local_shuffle_buffer_size=config.shuffle_buffer_size if shuffle_rows else None,
            local_shuffle_seed=(
                shuffle_buffer_seed(seed=config.seed, epoch=epoch, rank=rank)
                if shuffle_rows
                else None
            ),
            collate_fn=collate,
        ):
            num_batches += 1
            if to_skip:
                to_skip -= 1
                continue
            yield epoch, batch
        if num_batches == 0:
            # An endless loop over an empty shard would hang the run without a word.
            raise UserInputError(
                f"rank {rank}'s shard gave no batch of {batch_size} in epoch {epoch}: the split "
                "has fewer rows per worker than the per-worker batch size"
            )
        to_skip = 0  # a resumed position past the epoch's end starts the next epoch afresh
        epoch += 1


@functools.cache
def _collate_class() -> type:
    # The collate function's class (it runs in Ray's batch-formatting threads), defined on
    # first use so that importing this module does not import Ray or torch.
    from ray.data.collate_fn import NumpyBatchCollateFn

    class EpochCollate(NumpyBatchCollateFn):
        """numpy batch -> torch tensors: this epoch's flips, then normalisation."""

        def __init__(self, **options: Any) -> None:  # collate_rows's keywords for one epoch
            super().__init__()
            self.options = options

        def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
            return collate_rows(batch, **self.options)

    return EpochCollate
