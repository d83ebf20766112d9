"""Checks that run before training starts: a bad config fails here, naming the field.

Shared by the Ray driver (before Ray is imported or any worker starts) and the single-process
loop, so both refuse the same configs with the same messages. No Ray, no model built.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from raydiff.config import ExperimentConfig, to_dict
from raydiff.data.manifest import check_compatible, load_manifest
from raydiff.train.checkpoint import read_progress, require_checkpoint_dir, resume_point

logger = logging.getLogger(__name__)


def check_run(
    config: ExperimentConfig, *, resume: Path | None = None, num_workers: int | None = None
) -> None:
    """Raise ValueError / FileNotFoundError naming the field when the run cannot start.

    Checks the batch split over ``num_workers`` (default ``config.scaling.num_workers``) and
    microbatches, that the prepared shards exist and match the model (image size, channels,
    classes), and that ``train.init_checkpoint`` and ``resume`` exist.
    """
    workers = config.scaling.num_workers if num_workers is None else num_workers
    config.train.per_worker_batch(workers)
    manifest = load_manifest(config.data.data_dir)  # FileNotFoundError names the missing path
    check_compatible(
        manifest,
        image_size=config.model.image_size,
        channels=config.model.in_channels,
        class_cond=config.model.class_cond,
        num_classes=config.model.num_classes,
    )
    val = config.data.val_split
    if val and val in manifest.splits and manifest.splits[val].num_rows < workers:
        # Validation shards the split over the workers; an empty shard would end the run at its
        # last step, after all the training, before the final checkpoint.
        raise ValueError(
            f"data.val_split={val!r} has {manifest.splits[val].num_rows} images, fewer than the "
            f"{workers} workers it is split over: prepare a larger val split (raydiff prepare "
            f"--val-count N), train on fewer workers, or set data.val_split='' to skip validation"
        )
    init = config.train.init_checkpoint
    if init and not Path(init).is_file():
        raise FileNotFoundError(f"train.init_checkpoint={init!r} does not exist")
    if resume is not None:
        try:
            require_checkpoint_dir(resume)
        except FileNotFoundError as error:
            raise FileNotFoundError(f"--resume: {error}") from None


def check_resume_target(output_dir: Path, resume: Path | None) -> None:
    """``--resume`` starts a new run folder: refuse one that already holds a run's checkpoints.

    Re-running into such a folder continues *its* run (Ray Train restores its own latest
    checkpoint first), so ``--resume`` would be ignored, or two runs' checkpoints would mix.
    """
    if resume is None or not Path(output_dir).is_dir():
        return
    existing = sorted(p.name for p in Path(output_dir).glob("checkpoint_*") if p.is_dir())
    if existing:
        raise ValueError(
            f"--resume {resume}: the output folder {output_dir} already holds a run "
            f"({existing[-1]}); run without --resume to continue that run, or give --resume a "
            "new --output folder"
        )


def finished_run(
    config: ExperimentConfig, *, output_dir: Path, resume: Path | None = None
) -> dict[str, Any] | None:
    """The result of a run that is already at ``train.max_steps``, else None (there is work).

    Re-running a finished run (``make demo`` twice) would otherwise load the data, build the
    model (and on Ray start the worker group and the data pipeline) only to train zero steps.
    Logs a warning that says how to train on. Checkpoints written before ``progress.json``
    existed do not count as finished here (their step is only inside ``trainer.pt``).
    """
    resumed_from = resume_point(output_dir, resume)
    step = read_progress(resumed_from).get("step", 0) if resumed_from else 0
    if resumed_from is None or step < config.train.max_steps:
        return None
    logger.warning(
        "nothing to train: %s is at step %d and train.max_steps=%d; pass --max-steps N (N > %d) "
        "to train on, or --output DIR for a new run",
        resumed_from,
        step,
        config.train.max_steps,
        step,
    )
    return {"step": step, "checkpoint": str(resumed_from), "output_dir": str(output_dir)}


# Fields a resumed run may change: they do not change the weights' meaning or the objective.
RESUMABLE_CHANGES = frozenset({"model.use_checkpoint", "model.dropout", "model.use_fp16"})


def check_resume_compatible(config: ExperimentConfig, checkpoint: Path) -> None:
    """Refuse to continue ``checkpoint`` with other model or diffusion settings.

    A different architecture fails deep inside ``load_state_dict``; a different noise schedule,
    T, parameterisation or loss loads fine and silently trains something else. The message names
    each differing field and how to start a new run from the weights instead.
    """
    saved_file = Path(checkpoint) / "config.json"
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
        raise ValueError(
            f"cannot continue {checkpoint} with different model/diffusion settings ("
            + "; ".join(changed)
            + f"). Use the checkpoint's settings to continue it, or start a new run from its "
            f"weights: --output NEW_DIR --set train.init_checkpoint={Path(checkpoint) / 'model.pt'}"
        )
