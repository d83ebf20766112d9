"""TensorBoard: event files in the run folder's ``tensorboard/`` (``train/<metric>``,
``samples/ema``, ``sampler/weights``). The default tracker, a dependency of raydiff itself."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from raydiff.tracking import Point

EVENTS_DIR = "tensorboard"


class TensorBoardTracker:
    """A ``SummaryWriter`` on the run's local folder (a URI's staging folder: RunFiles uploads
    the events)."""

    name = "tensorboard"

    def __init__(self, local_dir: Path, *, start_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(
            str(local_dir / EVENTS_DIR),
            # Events a failed attempt logged past the step this one starts from (its checkpoint,
            # or 0 for a run restarted before the first one) are dropped: without this
            # TensorBoard shows two curves over the same steps.
            purge_step=start_step + 1,
        )
        self.logged_through = start_step  # what is past it was purged: written again

    def log_scalars(self, points: Sequence[Point]) -> None:
        for point in points:
            for key, value in point.values.items():
                self.writer.add_scalar(f"train/{key}", value, point.step, walltime=point.wall_time)

    def log_image(self, key: str, image: np.ndarray, *, step: int) -> None:
        self.writer.add_image(key, image, step, dataformats="HWC")

    def log_histogram(self, key: str, values: np.ndarray, *, step: int) -> None:
        import torch

        self.writer.add_histogram(key, torch.from_numpy(values), step)

    def log_checkpoint(self, location: str, *, step: int) -> None:
        pass  # the checkpoints are next to the events

    def flush(self, *, now: bool) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def open_tracker(local_dir: Path, *, start_step: int) -> TensorBoardTracker:
    return TensorBoardTracker(local_dir, start_step=start_step)
