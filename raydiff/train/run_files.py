"""What the main rank writes into a run folder while it trains: the resolved config, preview
grids, post-hoc EMA snapshots, and what it logs to the run's trackers (``tracking.backend``:
TensorBoard, MLflow, W&B; :mod:`raydiff.tracking`).

``output_dir`` may be a URI (``raydiff.storage.StoragePath``): the files are then written into a
local staging folder and each is uploaded after writing it.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import numpy as np
import torch

from raydiff.config import ExperimentConfig, to_dict
from raydiff.storage import MirroredFolder, StoragePath
from raydiff.tracking import Point, open_trackers
from raydiff.train.checkpoint import checkpoint_name
from raydiff.train.sample_grid import save_png, tile, to_uint8

logger = logging.getLogger(__name__)

POSTHOC_DIR = "posthoc_ema"
"""The run folder's post-hoc EMA snapshots (``raydiff ema`` reads them)."""


def snapshot_name(step: int) -> str:
    """The file of the post-hoc EMA snapshot of ``step``."""
    return f"snapshot_{step:07d}.pt"


class RunFiles:
    """The main rank's files of one run (see the module docstring); ``close`` at the end."""

    def __init__(
        self, config: ExperimentConfig, *, output_dir: StoragePath, start_step: int
    ) -> None:
        # Written in place (a local run folder), or staged locally and uploaded (a URI).
        self.files = MirroredFolder(output_dir)
        self.files.local.mkdir(parents=True, exist_ok=True)
        (self.files.local / "config.json").write_text(json.dumps(to_dict(config), indent=2))
        self.files.publish("config.json")
        self.output_dir = output_dir
        self.trackers = open_trackers(
            config, run_dir=output_dir, local_dir=self.files.local, start_step=start_step
        )
        # Per-step losses, written at log steps with the wall time of their step (no host sync).
        self.step_losses: list[tuple[int, torch.Tensor, float]] = []

    def add_step_loss(self, step: int, loss: torch.Tensor) -> None:
        """Keep ``loss`` (a device tensor) of ``step`` until the next :meth:`write_report`."""
        self.step_losses.append((step, loss, time.time()))

    def write_report(
        self, report: dict[str, Any], *, step: int, sampler_weights: np.ndarray | None
    ) -> None:
        """The kept step losses, the report's metrics and the timestep sampler's weights."""
        points = [
            Point(logged_step, {"loss_step": float(loss)}, wall_time)
            for logged_step, loss, wall_time in self.step_losses
        ]
        self.step_losses.clear()
        points.append(Point(step, {k: v for k, v in report.items() if k != "step"}))
        self.trackers.log_scalars(points)
        if sampler_weights is not None:
            self.trackers.log_histogram("sampler/weights", sampler_weights, step=step)

    def write_preview(self, images: torch.Tensor, *, step: int, columns: int | None = None) -> None:
        """``samples/samples_NNNNNN.png`` (``columns`` wide; default about sqrt(N)), logged as
        the image ``samples/ema`` of ``step``."""
        grid = tile(to_uint8(images), columns=columns)
        path = save_png(grid, self.files.local / "samples" / f"samples_{step:06d}.png")
        self.trackers.log_image("samples/ema", grid, step=step)
        logger.info("wrote sample grid %s", self.files.publish(path))

    def log_checkpoint(self, step: int) -> None:
        """The checkpoint of ``step`` (saved by the runtime) in the trackers."""
        self.trackers.log_checkpoint(str(self.output_dir / checkpoint_name(step)), step=step)

    def write_posthoc_snapshot(
        self, profiles: dict[str, dict[str, torch.Tensor]], *, step: int
    ) -> None:
        """``posthoc_ema/snapshot_NNNNNNN.pt``: the post-hoc EMA profiles at ``step`` (sigma_rel
        -> state dict), written whole or not at all (a restarted group writes the same step
        again, with the same weights)."""
        folder = self.files.local / POSTHOC_DIR
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / snapshot_name(step)
        partial = path.with_name(path.name + ".partial")
        torch.save({"step": step, "profiles": profiles}, partial)
        partial.replace(path)
        self.files.publish(path)
        if self.files.is_remote:  # uploaded: the staging folder need not keep every snapshot
            path.unlink()

    def close(self) -> None:
        self.trackers.close()
        self.files.close()
