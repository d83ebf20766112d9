"""Where evaluation results go: a JSON file, and the run's trackers when the checkpoint belongs
to a run. No Ray here.

A raydiff checkpoint ``RUN/checkpoint_NNNNNN`` belongs to the run ``RUN`` (its folder holds the
run's ``config.json``); its results go to ``RUN/evaluation/checkpoint_NNNNNN/`` and, as scalars
``eval/...`` at step NNNNNN, to the run's trackers (:func:`raydiff.tracking.log_evaluation`:
its TensorBoard, MLflow, W&B runs), next to the training curves. A run folder under a URI
(``s3://...``) works the same way.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from raydiff.config import ExperimentConfig
from raydiff.config.resolve import saved_config
from raydiff.storage import StoragePath, resolve_location, write_text_atomically
from raydiff.tracking import log_evaluation
from raydiff.train.checkpoint import CHECKPOINT_PATTERN

RESULTS_DIR = "evaluation"


@dataclass(frozen=True, kw_only=True)
class RunCheckpoint:
    """A checkpoint inside a run folder, and the step it holds."""

    run_dir: StoragePath
    checkpoint: StoragePath
    step: int

    @property
    def results_dir(self) -> StoragePath:
        return self.run_dir / RESULTS_DIR / self.checkpoint.name

    @property
    def config(self) -> ExperimentConfig:
        """The config the checkpoint was trained with."""
        return saved_config(self.checkpoint)


def run_checkpoint(path: str | StoragePath) -> RunCheckpoint | None:
    """The run ``path`` (a local path or a URI) belongs to, if it is a ``checkpoint_NNNNNN``
    folder of a run."""
    checkpoint = resolve_location(path)
    match = CHECKPOINT_PATTERN.match(checkpoint.name)
    if match is None or not checkpoint.is_dir():
        return None
    if not (checkpoint.parent / "config.json").is_file():
        return None
    return RunCheckpoint(run_dir=checkpoint.parent, checkpoint=checkpoint, step=int(match[1]))


def write_json(path: StoragePath, result: dict[str, Any]) -> StoragePath:
    """``result`` as indented JSON, atomically (NaN written as null)."""
    path.parent.mkdir(parents=True, exist_ok=True)  # nothing to do on an object store
    write_text_atomically(path, json.dumps(_finite(result), indent=2) + "\n")
    return path


def track(
    run: RunCheckpoint, *, scalars: dict[str, Any], images: dict[str, np.ndarray] | None = None
) -> list[str]:
    """``scalars`` (and ``images``) as ``eval/NAME`` at the checkpoint's step in its run's
    trackers (the checkpoint's ``tracking`` section); where they went."""
    return log_evaluation(
        run.config, run_dir=run.run_dir, step=run.step, scalars=scalars, images=images
    )


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
