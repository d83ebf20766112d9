"""Typed configuration of the Ray Data input pipeline (re-exported by ``raydiff.config``)."""

from __future__ import annotations

from dataclasses import dataclass

VALID_CHANNELS = (1, 3)


@dataclass(kw_only=True)
class DataConfig:
    """Where the prepared dataset lives and how it is streamed to the training workers.

    The global batch size is not here: it belongs to the training config, which derives the
    per-worker batch from it and passes that to ``iterate_batches``.
    """

    data_dir: str = "data/fashion-mnist"
    """Path or URI (``s3://``, ``gs://``, ...) of a dataset written by ``raydiff prepare``."""
    image_size: int = 64
    """Side length in pixels the model expects; the manifest must match it."""
    channels: int = 3
    """Image channels the model expects (1 grey, 3 RGB); the manifest must match it."""
    class_cond: bool = False
    """Deliver class labels as ``y`` with every batch (the manifest must have classes)."""
    random_flip: bool = True
    """Flip each training image horizontally with probability 1/2, seeded by (seed, epoch, row)."""
    shuffle_buffer_size: int = 2048
    """Rows in each worker's local shuffle buffer (0 disables the row-level shuffle)."""
    shuffle_blocks: bool = True
    """Reorder blocks (cached) or shard files (streaming) every epoch, seeded by (seed, epoch)."""
    deterministic: bool = True
    """Keep Ray Data's output order fixed, so a seed reproduces every epoch's order exactly."""
    cache_max_bytes: int = 1 << 30
    """Decoded datasets up to this many bytes are decoded once and kept in the object store."""
    prefetch_batches: int = 4
    """Batches each worker prepares ahead of the training step."""
    decode_batch_size: int = 256
    """Rows per ``map_batches`` decode call on the Ray Data CPUs."""
    seed: int = 0
    """Base seed of the block order, the shuffle buffer and the flips."""
    train_split: str = "train"
    """Manifest split used for training."""
    val_split: str = "val"
    """Manifest split used for validation metrics ("" for none)."""

    def __post_init__(self) -> None:
        if not isinstance(self.data_dir, str) or not self.data_dir.strip():
            raise ValueError(
                f"data.data_dir={self.data_dir!r} is invalid: give the path or URI of a dataset "
                "written by `raydiff prepare`"
            )
        _check_int("image_size", self.image_size, minimum=1)
        if self.channels not in VALID_CHANNELS:
            raise ValueError(
                f"data.channels={self.channels!r} is invalid; valid values: {VALID_CHANNELS}"
            )
        _check_int("shuffle_buffer_size", self.shuffle_buffer_size, minimum=0)
        _check_int("cache_max_bytes", self.cache_max_bytes, minimum=0)
        _check_int("prefetch_batches", self.prefetch_batches, minimum=0)
        _check_int("decode_batch_size", self.decode_batch_size, minimum=1)
        _check_int("seed", self.seed, minimum=0)
        if not self.train_split:
            raise ValueError(f"data.train_split={self.train_split!r} is invalid: name a split")
        for name in ("class_cond", "random_flip", "shuffle_blocks", "deterministic"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"data.{name}={value!r} is invalid; valid values: True, False")


def _check_int(name: str, value: object, *, minimum: int) -> None:
    # bool is an int subclass; reject it so that `--set data.seed=true` is not read as 1.
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"data.{name}={value!r} is invalid; valid values: integers >= {minimum}")
