"""Checks that run before training starts: a bad config fails here, naming the field.

Shared by the Ray driver (before Ray is imported or any worker starts) and the single-process
loop, so both refuse the same configs with the same messages. No Ray, no model built.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raydiff.config import ExperimentConfig, to_dict
from raydiff.data.manifest import Manifest, check_compatible
from raydiff.errors import UserInputError
from raydiff.storage import StoragePath, as_location, check_writable, local_path
from raydiff.train.checkpoint import (
    read_metrics,
    read_progress,
    require_checkpoint_dir,
    resume_point,
)

logger = logging.getLogger(__name__)


def check_run(
    config: ExperimentConfig,
    *,
    manifest: Manifest,
    resume: StoragePath | None = None,
    num_workers: int | None = None,
) -> None:
    """Raise ValueError / FileNotFoundError naming the field when the run cannot start: the
    batch split over ``num_workers`` (default: every size ``scaling.num_workers`` allows) and
    microbatches, the prepared shards against the model (image size, channels, classes),
    ``train.init_checkpoint`` and ``resume``, the trackers of ``tracking.backend`` installed.
    """
    config.tracking.check_installed()  # a tracker's extra: refused here, not in a worker
    if num_workers is None:
        config.train.check_worker_sizes(config.scaling.worker_sizes)
    else:
        config.train.per_worker_batch(num_workers)
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


def check_resume_target(output_dir: StoragePath, resume: StoragePath | None) -> None:
    """``--resume`` starts a new run folder: refuse one that already holds a run's checkpoints.

    Re-running into such a folder continues *its* run (Ray Train restores its own latest
    checkpoint first), so ``--resume`` would be ignored, or two runs' checkpoints would mix.
    """
    output_dir = as_location(output_dir)
    if resume is None or not output_dir.is_dir():
        return
    existing = sorted(
        p.name for p in output_dir.iterdir() if p.name.startswith("checkpoint_") and p.is_dir()
    )
    if existing:
        raise UserInputError(
            f"--resume {resume}: the output folder {output_dir} already holds a run "
            f"({existing[-1]}); run without --resume to continue that run, or give --resume a "
            "new --output folder"
        )


@dataclass(frozen=True)
class StartPoint:
    """Where a run starts: the checkpoint it continues (None: from scratch) and its progress."""

    checkpoint: StoragePath | None
    progress: dict[str, int]  # the checkpoint's progress.json ({} from scratch)
    finished: dict[str, Any] | None  # the run's result when it is already at train.max_steps


def plan_start(
    config: ExperimentConfig,
    *,
    output_dir: StoragePath,
    manifest: Manifest,
    resume: StoragePath | None = None,
    num_workers: int | None = None,
) -> StartPoint:
    """Every check before a run starts (the Ray driver and ``--single-process`` alike), raising
    naming the field, and the checkpoint it continues from: ``--resume``, else the newest
    complete one in ``output_dir``. A run already at ``train.max_steps`` (by its
    ``progress.json``) comes back with ``finished`` set and a warning that says how to train on,
    instead of loading the data and building the model to train zero steps.
    """
    check_run(config, manifest=manifest, resume=resume, num_workers=num_workers)
    check_writable(output_dir, flag="--output")  # a refused bucket now, not at a checkpoint
    check_resume_target(output_dir, resume)
    checkpoint = resume_point(output_dir, resume)
    if checkpoint is None:
        return StartPoint(checkpoint=None, progress={}, finished=None)
    progress = read_progress(checkpoint)
    step = progress.get("step", 0)
    if step >= config.train.max_steps:
        logger.warning(
            "nothing to train: %s is at step %d and train.max_steps=%d; pass --max-steps N "
            "(N > %d) to train on, or --output DIR for a new run",
            checkpoint,
            step,
            config.train.max_steps,
            step,
        )
        finished = {
            **read_metrics(checkpoint),  # what the run reported with it
            "step": step,
            "checkpoint": str(checkpoint),
            "output_dir": str(output_dir),
            "already_finished": True,
        }
        return StartPoint(checkpoint=checkpoint, progress=progress, finished=finished)
    check_resume_compatible(config, checkpoint)
    return StartPoint(checkpoint=checkpoint, progress=progress, finished=None)


# Fields a resumed run may change: they do not change the weights' meaning or the objective.
RESUMABLE_CHANGES = frozenset({"model.use_checkpoint", "model.dropout", "model.use_fp16"})


def check_resume_compatible(config: ExperimentConfig, checkpoint: StoragePath) -> None:
    """Refuse to continue ``checkpoint`` with other model or diffusion settings.

    A different architecture fails deep inside ``load_state_dict``; a different noise schedule,
    T, parameterisation or loss loads fine and silently trains something else. The message names
    each differing field and how to start a new run from the weights instead.
    """
    checkpoint = as_location(checkpoint)
    saved_file = checkpoint / "config.json"
    if not saved_file.is_file():
        return
    saved = json.loads(saved_file.read_text())
    current = to_dict(config)
    changed = [
        f"{section}.{name}: checkpoint {saved[section][name]!r}, now {value!r}"
        for section in ("model", "diffusion")
        for name, value in current[section].items()
        if name in saved.get(section, {})
        and saved[section][name] != value
        and f"{section}.{name}" not in RESUMABLE_CHANGES
    ]
    if changed:
        # init_checkpoint is read by every worker: local only
        weights = local_path(checkpoint / "model.pt") or (
            f"PATH (a copy of {checkpoint / 'model.pt'} on a local or shared disk)"
        )
        raise UserInputError(
            f"cannot continue {checkpoint} with different model/diffusion settings ("
            + "; ".join(changed)
            + f"). Use the checkpoint's settings to continue it, or start a new run from its "
            f"weights: --output NEW_DIR --set train.init_checkpoint={weights}"
        )
