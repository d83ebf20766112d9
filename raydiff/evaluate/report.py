"""Where evaluation results go: a JSON file, and the run's TensorBoard when the checkpoint
belongs to a run. No Ray here.

A raydiff checkpoint ``RUN/checkpoint_NNNNNN`` belongs to the run ``RUN`` (its folder holds the
run's ``config.json``); its results go to ``RUN/evaluation/checkpoint_NNNNNN/`` and, as scalars
``eval/...`` at step NNNNNN, to ``RUN/tensorboard`` in an event file of their own
(``*.evaluation``), so TensorBoard shows them next to the training curves and a later
evaluation never rewrites the trainer's events. A run folder under a URI (``s3://...``) works
the same way: results are written locally, then uploaded (:class:`raydiff.storage.
MirroredFolder`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from raydiff.storage import MirroredFolder, StoragePath, resolve_location, write_text_atomically
from raydiff.train.checkpoint import CHECKPOINT_PATTERN

RESULTS_DIR = "evaluation"
TENSORBOARD_SUFFIX = ".evaluation"


@dataclass(frozen=True, kw_only=True)
class RunCheckpoint:
    """A checkpoint inside a run folder, and the step it holds."""

    run_dir: StoragePath
    checkpoint: StoragePath
    step: int

    @property
    def results_dir(self) -> StoragePath:
        return self.run_dir / RESULTS_DIR / self.checkpoint.name


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


def add_to_tensorboard(
    run_dir: StoragePath,
    *,
    step: int,
    scalars: dict[str, float],
    images: dict[str, np.ndarray] | None = None,
) -> None:
    """``eval/NAME`` scalars (and uint8 ``[H, W, C]`` images) at ``step`` in the run's
    TensorBoard, in an event file of their own."""
    from torch.utils.tensorboard import SummaryWriter

    events = MirroredFolder(run_dir / "tensorboard")
    try:
        writer = SummaryWriter(str(events.local), filename_suffix=TENSORBOARD_SUFFIX)
        try:
            for name, value in scalars.items():
                if isinstance(value, float | int) and math.isfinite(value):
                    writer.add_scalar(f"eval/{name}", value, step)
            for name, image in (images or {}).items():
                writer.add_image(f"eval/{name}", image, step, dataformats="HWC")
        finally:
            writer.close()
        if events.is_remote:  # the staging folder holds this writer's file only
            for file in events.local.iterdir():
                events.publish(file.name)
    finally:
        events.close()


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
