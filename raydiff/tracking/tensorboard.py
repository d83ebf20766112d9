"""TensorBoard, the default tracker (a dependency of raydiff itself): event files in the run
folder's ``tensorboard/``, the main rank's (``train/<metric>``, ``samples/ema``,
``sampler/weights``) and each evaluation's in a file of its own (``*.evaluation``: ``eval/...``).
A URI's run folder gets them uploaded at every checkpoint and at most every
``EVENTS_UPLOAD_INTERVAL_S`` in between (a failed attempt's later events are purged on resume).
"""

from __future__ import annotations

from collections.abc import Sequence
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

    def __init__(
        self,
        config: ExperimentConfig,
        entry: None,
        *,
        run_dir: StoragePath,
        start_step: int,
        role: Role,
        **_: Any,
    ) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.events = MirroredFolder(run_dir / EVENTS_DIR)
        self.where = f"tensorboard: tensorboard --logdir {self.events.target}"
        training = role == "training"
        self.writer = SummaryWriter(
            str(self.events.local),
            filename_suffix="" if training else ".evaluation",
            # Events a failed attempt logged past the step this one starts from (its checkpoint,
            # or 0 for a run restarted before the first one) are dropped: without this
            # TensorBoard shows two curves over the same steps.
            purge_step=start_step + 1 if training else None,
        )
        # What is past the start was purged; an evaluation's checkpoints are evaluated once.
        self.logged_through = start_step if training else -1
        self.prefix = "train/" if training else ""

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


open_tracker = TensorBoardTracker  # the Backend protocol's name for it
