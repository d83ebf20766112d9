"""Weights & Biases (``pip install 'raydiff[wandb]'``): one W&B run per run folder, its id
chosen by the driver and kept in ``tracking.json``; every process that logs into it resumes it
by that id (offline: each writes its part into ``RUN/wandb/``, which ``wandb sync`` uploads into
the one run). W&B keeps no history an offline process could read back, so the last step logged
is kept in ``tracking.json`` (``logged_through``). docs/tracking.md says the rest.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import secrets
import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raydiff.config import ExperimentConfig
from raydiff.storage import StoragePath, local_path
from raydiff.tracking import Point, Role, flat_params, greyscale_2d, read_state, write_state

logger = logging.getLogger(__name__)

KEEPS_RUNS = True

EVAL_STEP = "eval/step"
"""The x-axis of the checkpoint evaluations: the evaluator logs them as the checkpoints'
evaluations end, later than the training steps W&B's own step has reached."""


def start(
    config: ExperimentConfig,
    *,
    folder: StoragePath,
    key: str,
    entry: Mapping[str, Any] | None,
    parent: Mapping[str, Any] | None,
    sweep: bool,
) -> dict[str, Any]:
    """The folder's W&B run id and settings (a run is made by the first process that logs)."""
    if entry is not None:
        return dict(entry)
    options = config.tracking
    mode = options.wandb_mode
    if mode == "auto":
        mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
    group = parent["group"] if parent is not None else (f"{folder.name}-{key[:6]}" if sweep else "")
    entry = {
        # 8 characters of [a-z0-9], as W&B makes its run ids.
        "run_id": "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8)),
        "project": options.wandb_project,
        "entity": options.wandb_entity,
        "mode": mode,
        "group": group,
        "logged_through": -1,
    }
    logger.info("W&B run %s (%s, project %s)", entry["run_id"], mode, options.wandb_project)
    return entry


def _init(entry: Mapping[str, Any], *, name: str, local_dir: Path, **kwargs: Any) -> Any:
    import wandb

    local_dir.mkdir(parents=True, exist_ok=True)
    return wandb.init(
        id=entry["run_id"],
        project=entry["project"],
        entity=entry["entity"] or None,
        mode=entry["mode"],
        group=entry["group"] or None,
        name=name,
        dir=os.environ.get("WANDB_DIR") or str(local_dir),
        resume="allow",
        reinit="create_new",  # a run object of its own, whatever else this process has open
        settings=wandb.Settings(console="off", silent=True, disable_git=True),
        **kwargs,
    )


class WandbTracker:
    """Logs into the run an entry of ``tracking.json`` names."""

    def __init__(
        self,
        config: ExperimentConfig,
        entry: Mapping[str, Any],
        *,
        run_dir: StoragePath,
        local_dir: Path,
        role: Role,
        **_: Any,
    ) -> None:
        self.run_dir, self.role = run_dir, role
        self.where = f"wandb: run {entry['run_id']} ({entry['mode']}, project {entry['project']})"
        # The evaluator's: each checkpoint is evaluated once.
        self.logged_through = int(entry.get("logged_through", -1)) if role == "training" else -1
        self.run = _init(
            entry,
            name=run_dir.name,
            local_dir=local_path(run_dir) or local_dir,
            config=flat_params(config),
            allow_val_change=True,  # a resumed run may change a setting (train.max_steps)
        )
        if role == "evaluation":
            self.run.define_metric(EVAL_STEP)
            self.run.define_metric("eval/*", step_metric=EVAL_STEP)

    def log_scalars(self, points: Sequence[Point]) -> None:
        if self.role == "evaluation":
            for point in points:
                self.run.log({**point.values, EVAL_STEP: point.step})
            return
        for point in sorted(points, key=lambda p: p.step):
            self.run.log(dict(point.values), step=point.step)
        self._record(points[-1].step)

    def _record(self, step: int) -> None:
        """The last step logged, in the run folder's ``tracking.json`` (see the module
        docstring)."""
        state = read_state(self.run_dir)
        state["wandb"]["logged_through"] = max(step, state["wandb"].get("logged_through", -1))
        write_state(self.run_dir, state)

    def log_image(self, key: str, image: np.ndarray, *, step: int) -> None:
        import wandb

        picture = wandb.Image(greyscale_2d(image))
        if self.role == "evaluation":
            self.run.log({key: picture, EVAL_STEP: step})
        else:
            self.run.log({key: picture}, step=step)

    def log_histogram(self, key: str, values: np.ndarray, *, step: int) -> None:
        pass  # TensorBoard's alone

    def log_checkpoint(self, location: str, *, step: int) -> None:
        self.run.summary["checkpoint"] = str(location)
        self.run.summary[f"checkpoints/{Path(str(location)).name}"] = str(location)

    def flush(self, *, now: bool) -> None:
        pass  # W&B's own process writes as it goes

    def close(self) -> None:
        self.run.finish()


open_tracker = WandbTracker  # the Backend protocol's name for it


def log_results(entry: Mapping[str, Any], *, results_csv: StoragePath, folder: StoragePath) -> None:
    """A sweep's results table, in its parent run (job type ``sweep``) of the trials' group."""
    import wandb

    rows = list(csv.reader(io.StringIO(results_csv.read_text())))
    local = local_path(folder) or Path(os.environ.get("TMPDIR", "/tmp"))
    run = _init(entry, name=folder.name, local_dir=local, job_type="sweep")
    run.log({"results": wandb.Table(columns=rows[0], data=rows[1:])})
    run.finish()
