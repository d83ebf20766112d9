"""TensorBoard: event files in the run folder's ``tensorboard/``: the main rank's
(``train/<metric>``, ``samples/ema``, ``sampler/weights``) and, in files of their own
(``*.evaluation``), each evaluation's (``eval/...``), so a later evaluation never rewrites the
trainer's events. The default tracker, a dependency of raydiff itself.

A run folder under a URI gets the same files: written into a local staging folder and uploaded,
the main rank's at every checkpoint and at most every ``EVENTS_UPLOAD_INTERVAL_S`` in between
(what a failed attempt logged after its last checkpoint is dropped on resume anyway, see
``purge_step``), an evaluation's when it closes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raydiff.config import ExperimentConfig
from raydiff.storage import MirroredFolder, StoragePath
from raydiff.tracking import Point, Role

KEEPS_RUNS = False
EVENTS_DIR = "tensorboard"
EVENTS_UPLOAD_INTERVAL_S = 60.0
"""A remote run folder's training events are uploaded at most this often between checkpoints."""


class TensorBoardTracker:
    """A ``SummaryWriter`` on the run folder's ``tensorboard/`` (a URI's: a staging folder)."""

    def __init__(self, run_dir: StoragePath, *, start_step: int, role: Role) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.events = MirroredFolder(run_dir / EVENTS_DIR)
        self.where = f"tensorboard: tensorboard --logdir {self.events.target}"
        if role == "evaluation":
            self.writer = SummaryWriter(str(self.events.local), filename_suffix=".evaluation")
            self.logged_through, self.prefix = -1, ""  # each checkpoint is evaluated once
            return
        self.writer = SummaryWriter(
            str(self.events.local),
            # Events a failed attempt logged past the step this one starts from (its checkpoint,
            # or 0 for a run restarted before the first one) are dropped: without this
            # TensorBoard shows two curves over the same steps.
            purge_step=start_step + 1,
        )
        self.logged_through, self.prefix = start_step, "train/"  # what is past it was purged

    def log_scalars(self, points: Sequence[Point]) -> None:
        for point in points:
            for key, value in point.values.items():
                self.writer.add_scalar(
                    self.prefix + key, value, point.step, walltime=point.wall_time
                )

    def log_image(self, key: str, image: np.ndarray, *, step: int) -> None:
        self.writer.add_image(key, image, step, dataformats="HWC")

    def log_histogram(self, key: str, values: np.ndarray, *, step: int) -> None:
        import torch

        self.writer.add_histogram(key, torch.from_numpy(values), step)

    def log_checkpoint(self, location: str, *, step: int) -> None:
        pass  # the checkpoints are next to the events

    def flush(self, *, now: bool) -> None:
        self.writer.flush()
        self._upload(min_interval_s=0 if now else EVENTS_UPLOAD_INTERVAL_S)

    def close(self) -> None:
        self.writer.close()
        self._upload(min_interval_s=0)
        self.events.close()

    def _upload(self, *, min_interval_s: float) -> None:
        """A remote run folder's: this writer's files (the staging folder holds no others)."""
        if self.events.is_remote:
            for file in self.events.local.iterdir():
                self.events.publish(file.name, min_interval_s=min_interval_s)


def start(config: ExperimentConfig, **kwargs: Any) -> dict[str, Any]:
    return {}  # not called (KEEPS_RUNS): the events are the run folder's own


def open_tracker(
    config: ExperimentConfig,
    entry: Mapping[str, Any] | None,
    *,
    run_dir: StoragePath,
    local_dir: Path,
    start_step: int,
    role: Role,
) -> TensorBoardTracker:
    return TensorBoardTracker(run_dir, start_step=start_step, role=role)


def log_results(entry: Mapping[str, Any], **kwargs: Any) -> None:
    pass  # not called (KEEPS_RUNS): no parent runs; the table is in the sweep's folder
