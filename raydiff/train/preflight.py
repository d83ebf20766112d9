"""Checks that run before training starts: a bad config fails here, naming the field.

Shared by the Ray driver (before Ray is imported or any worker starts) and the single-process
loop, so both refuse the same configs with the same messages. No Ray, no model built.
"""

from __future__ import annotations

from pathlib import Path

from raydiff.config import ExperimentConfig
from raydiff.data.manifest import check_compatible, load_manifest
from raydiff.train.checkpoint import require_checkpoint_dir


def check_run(
    config: ExperimentConfig, *, resume: Path | None = None, num_workers: int | None = None
) -> None:
    """Raise ValueError / FileNotFoundError naming the field when the run cannot start.

    Checks the batch split over ``num_workers`` (default ``config.scaling.num_workers``) and
    microbatches, that the prepared shards exist and match the model (image size, channels,
    classes), and that ``train.init_checkpoint`` and ``resume`` exist.
    """
    config.train.per_worker_batch(
        config.scaling.num_workers if num_workers is None else num_workers
    )
    manifest = load_manifest(config.data.data_dir)  # FileNotFoundError names the missing path
    check_compatible(
        manifest,
        image_size=config.model.image_size,
        channels=config.model.in_channels,
        class_cond=config.model.class_cond,
        num_classes=config.model.num_classes,
    )
    init = config.train.init_checkpoint
    if init and not Path(init).is_file():
        raise FileNotFoundError(f"train.init_checkpoint={init!r} does not exist")
    if resume is not None:
        try:
            require_checkpoint_dir(resume)
        except FileNotFoundError as error:
            raise FileNotFoundError(f"--resume: {error}") from None
