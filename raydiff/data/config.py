"""Typed configuration of the Ray Data input pipeline (re-exported by ``raydiff.config``)."""

from __future__ import annotations

from dataclasses import dataclass

from raydiff.errors import ConfigError

VALID_CHANNELS = (1, 3)


@dataclass(kw_only=True, frozen=True)
class DataConfig:
    """Where the prepared dataset lives and how it reaches the training workers.

    The global batch size is not here: it belongs to the training config, which derives the
    per-worker batch from it. A training split within ``cache_max_bytes`` is read in one seeded
    order per epoch (``raydiff.data.cached_split``); the shuffle and order settings below are
    those of a larger, streamed split.
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
    """Rows in each worker's local shuffle buffer of a streamed split (0: no row shuffle)."""
    shuffle_blocks: bool = True
    """Reorder a streamed split's shard files every epoch, seeded by (seed, epoch)."""
    deterministic: bool = True
    """Keep Ray Data's output order fixed, so a seed reproduces a streamed epoch exactly."""
    cache_max_bytes: int = 1 << 30
    """Splits up to this many decoded bytes are decoded once and kept in the object store; a
    cached training split is fully reshuffled every epoch, the same batches at any worker count."""
    prefetch_batches: int = 4
    """Batches each worker prepares ahead of the training step (streamed splits)."""
    decode_batch_size: int = 256
    """Rows per ``map_batches`` decode call on the Ray Data CPUs."""
    seed: int = 0
    """Base seed of the per-epoch order (cached), the file order and shuffle buffer
    (streamed) and the flips."""
    train_split: str = "train"
    """Manifest split used for training."""
    val_split: str = "val"
    """Manifest split used for validation metrics ("" for none)."""

    def __post_init__(self) -> None:
        for name in _CHECKED_FIELDS:
            check_data_field(name, getattr(self, name))


_MINIMUMS = {
    "image_size": 1,
    "shuffle_buffer_size": 0,
    "cache_max_bytes": 0,
    "prefetch_batches": 0,
    "decode_batch_size": 1,
    "seed": 0,
}
_BOOLS = ("class_cond", "random_flip", "shuffle_blocks", "deterministic")
_CHECKED_FIELDS = ("data_dir", "image_size", "channels", *_MINIMUMS, "train_split", *_BOOLS)


def check_data_field(
    name: str, value: object, *, section: str = "data", field: str | None = None
) -> None:
    """Raise ``ConfigError`` if ``value`` is not valid for the ``DataConfig`` field ``name``.

    ``section`` and ``field`` name where the value was set, where that is not ``data.<name>``: an
    experiment config derives ``data.image_size`` from ``model.image_size`` (and a few others)
    and reports a bad value there.
    """
    if name == "data_dir":
        valid = isinstance(value, str) and bool(value.strip())
        reason = "give the path or URI of a dataset written by `raydiff prepare`"
    elif name == "channels":
        valid, reason = value in VALID_CHANNELS, f"valid values: {VALID_CHANNELS}"
    elif name == "train_split":
        valid, reason = bool(value), "name a split"
    elif name in _BOOLS:
        valid, reason = isinstance(value, bool), "valid values: True, False"
    else:
        minimum = _MINIMUMS[name]
        # bool is an int subclass; reject it so that `--set data.seed=true` is not read as 1.
        valid = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
        reason = f"valid values: integers >= {minimum}"
    if not valid:
        raise ConfigError(section=section, field=field or name, value=value, reason=reason)
