"""Experiment tracking, the one logging seam: every writer of metrics (the training loop's main
rank, the checkpoint evaluator, ``raydiff evaluate``, the post-hoc EMA sweep) logs through
:class:`Trackers`. One interface (:class:`Tracker`), one module per backend (:class:`Backend`:
:mod:`.tensorboard`, :mod:`.mlflow`, :mod:`.wandb`), chosen by ``tracking.backend``. No Ray here.

One tracked run per run folder, whatever happens to the run (docs/tracking.md): the driver
creates it (:func:`start_tracking`) and keeps its ids in ``RUN/tracking.json``, where the main
rank (:func:`open_trackers`) and every evaluation (:func:`log_evaluation`) find it again. Each
step is logged once: a tracker knows the last step its run holds (``logged_through``), and steps
up to it, trained again after a restart from an older checkpoint, are not logged again (MLflow
would keep both values). A sweep or family is a parent run (:func:`start_parent_tracking`,
:func:`finish_parent_tracking`: its results table) with a child per trial or stage.
"""

from __future__ import annotations

import importlib
import json
import math
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from raydiff.config import ExperimentConfig, to_dict
from raydiff.storage import StoragePath, write_text_atomically

TRACKING_FILE = "tracking.json"
"""``RUN/tracking.json`` (and a sweep folder's): ``key`` (this run's identity, tagged on its
tracked runs so that a driver killed between creating one and writing this file finds it again)
and each backend's entry (its run id and what it needs to log there again)."""

Role = Literal["training", "evaluation"]
"""Who logs: the main rank ('training': the run's steps), or an evaluation of its checkpoints
('evaluation': ``eval/...`` at a checkpoint's step, whenever it ends)."""


@dataclass(frozen=True)
class Point:
    """Metrics of one step (``wall_time``: when it was trained, default now)."""

    step: int
    values: Mapping[str, float]
    wall_time: float | None = None


class Tracker(Protocol):
    """One backend's tracked run, open for logging."""

    logged_through: int
    """The last step the tracked run held when it was opened (-1: none)."""
    where: str
    """Where the logged values are, for a person: ``NAME: ...``."""

    def log_scalars(self, points: Sequence[Point]) -> None:
        """Metrics at their steps (ascending): one report's, logged together."""
        ...

    def log_image(self, key: str, image: np.ndarray, *, step: int) -> None:
        """A uint8 ``[H, W, C]`` image (a grid) at ``step``."""
        ...

    def log_histogram(self, key: str, values: np.ndarray, *, step: int) -> None:
        """The distribution of ``values`` at ``step`` (a backend without histograms: none)."""
        ...

    def log_checkpoint(self, location: str, *, step: int) -> None:
        """Where the checkpoint of ``step`` is."""
        ...

    def flush(self, *, now: bool) -> None:
        """What the backend buffers, written out (``now``: whatever its interval)."""
        ...

    def close(self) -> None: ...


class Backend(Protocol):
    """A tracking backend: the module of this package named after it (``tracking.backend``)."""

    KEEPS_RUNS: bool
    """Whether it has runs of its own, whose ids ``tracking.json`` keeps (TensorBoard's events
    are the run folder's own)."""
    open_tracker: Callable[..., Tracker]
    """``(config, entry, *, run_dir, local_dir, start_step, role)``: a :class:`Tracker` logging
    into the run ``entry`` names (None: a backend without runs); the backend's tracker class."""
    start: Callable[..., dict[str, Any]]
    """(``KEEPS_RUNS`` only) ``(config, *, folder, key, entry, parent, sweep)``: the folder's run
    (``entry``: the one ``tracking.json`` names, if any) created or found again; its entry."""
    log_results: Callable[..., None]
    """(``KEEPS_RUNS`` only) ``(entry, *, results_csv, folder)``: a sweep's or family's table in
    its parent run, which then ends."""


def read_state(folder: StoragePath) -> dict[str, Any]:
    """``folder``'s ``tracking.json`` ({} when it has none)."""
    path = folder / TRACKING_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def write_state(folder: StoragePath, state: Mapping[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)  # nothing to do on an object store
    write_text_atomically(folder / TRACKING_FILE, json.dumps(state, indent=2) + "\n")


def flat_params(config: ExperimentConfig) -> dict[str, str]:
    """The resolved config as ``section.field`` -> its value as text."""
    return {
        f"{section}.{name}": str(value)
        for section, fields in to_dict(config).items()
        for name, value in fields.items()
    }


def greyscale_2d(image: np.ndarray) -> np.ndarray:
    """A one-channel ``[H, W, 1]`` image as ``[H, W]`` (greyscale), others as they are."""
    return image[..., 0] if image.ndim == 3 and image.shape[-1] == 1 else image


def _backends(config: ExperimentConfig) -> dict[str, Backend]:
    """The modules of the config's backends (imported when chosen: each package they log
    through is imported on first use, an optional extra)."""
    return {
        name: importlib.import_module(f"{__name__}.{name}")  # type: ignore[misc]
        for name in config.tracking.backends
    }


def keeps_runs(config: ExperimentConfig) -> bool:
    """Whether a backend of ``config`` has runs of its own (MLflow, W&B: in ``tracking.json``)."""
    return any(backend.KEEPS_RUNS for backend in _backends(config).values())


def start_tracking(
    config: ExperimentConfig,
    *,
    run_dir: StoragePath,
    parent: Mapping[str, Any] | None = None,
    sweep: bool = False,
) -> dict[str, Any]:
    """Create the run's tracked runs, or find them in ``RUN/tracking.json``; the state written
    there. ``parent``: a sweep's state (:func:`start_parent_tracking`), whose runs are the
    parents; ``sweep``: these are a sweep's. Called by the driver before anything trains."""
    backends = {name: b for name, b in _backends(config).items() if b.KEEPS_RUNS}
    if not backends:
        return {}  # nothing to keep
    state = read_state(run_dir)
    if "key" not in state:  # first: a run created after this is found by it again
        state["key"] = uuid.uuid4().hex
        write_state(run_dir, state)
    for name, backend in backends.items():
        entry = backend.start(
            config,
            folder=run_dir,
            key=state["key"],
            entry=state.get(name),
            parent=(parent or {}).get(name),
            sweep=sweep,
        )
        if entry != state.get(name):
            state[name] = entry
            write_state(run_dir, state)
    return state


def start_parent_tracking(config: ExperimentConfig, *, sweep_dir: StoragePath) -> dict[str, Any]:
    """A sweep's or a family's parent runs (created once, found again when it continues)."""
    return start_tracking(config, run_dir=sweep_dir, sweep=True)


def finish_parent_tracking(
    config: ExperimentConfig, *, sweep_dir: StoragePath, results_csv: StoragePath
) -> None:
    """A sweep's or a family's results table, as an artifact of its parent runs."""
    state = read_state(sweep_dir)
    for name, backend in _backends(config).items():
        if name in state:
            backend.log_results(state[name], results_csv=results_csv, folder=sweep_dir)


class Trackers:
    """The trackers of one run: each step is logged once to each (see the module docstring)."""

    def __init__(self, trackers: Sequence[Tracker]) -> None:
        self.trackers = list(trackers)

    def log_scalars(self, points: Sequence[Point]) -> None:
        for tracker in self.trackers:
            new = [p for p in points if p.step > tracker.logged_through]
            if new:
                tracker.log_scalars(new)

    def log_image(self, key: str, image: np.ndarray, *, step: int) -> None:
        for tracker in self.trackers:
            if step > tracker.logged_through:
                tracker.log_image(key, image, step=step)

    def log_histogram(self, key: str, values: np.ndarray, *, step: int) -> None:
        for tracker in self.trackers:
            if step > tracker.logged_through:
                tracker.log_histogram(key, values, step=step)

    def log_checkpoint(self, location: str, *, step: int) -> None:
        for tracker in self.trackers:
            tracker.log_checkpoint(location, step=step)

    def flush(self, *, now: bool) -> None:
        for tracker in self.trackers:
            tracker.flush(now=now)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()


def open_trackers(
    config: ExperimentConfig,
    *,
    run_dir: StoragePath,
    local_dir: Path,
    start_step: int,
    role: Role = "training",
) -> Trackers:
    """The trackers of the run in ``run_dir`` (its tracked runs: :func:`start_tracking`), open
    for logging. ``local_dir``: a local folder for the backends' own files (the run folder, or a
    URI's staging folder); ``start_step``: the step the run continues from."""
    state = read_state(run_dir) if keeps_runs(config) else {}
    trackers = []
    for name, backend in _backends(config).items():
        if backend.KEEPS_RUNS and name not in state:
            raise RuntimeError(
                f"{run_dir}/{TRACKING_FILE} names no {name} run: the driver starts the tracked "
                "runs (start_tracking) before the workers"
            )
        trackers.append(
            backend.open_tracker(
                config,
                state.get(name),
                run_dir=run_dir,
                local_dir=local_dir,
                start_step=start_step,
                role=role,
            )
        )
    return Trackers(trackers)


def log_evaluation(
    config: ExperimentConfig,
    *,
    run_dir: StoragePath,
    step: int,
    scalars: Mapping[str, Any],
    images: Mapping[str, np.ndarray] | None = None,
) -> list[str]:
    """An evaluation of the checkpoint of ``step`` of the run in ``run_dir`` (``config``: the
    run's), in the run's trackers: the finite ``scalars`` as ``eval/NAME`` and the uint8
    ``[H, W, C]`` ``images`` as ``eval/NAME``, at ``step``. Returns where they went (a line per
    tracker)."""
    finite = {
        f"eval/{name}": value
        for name, value in scalars.items()
        if isinstance(value, float | int) and math.isfinite(value)
    }
    with tempfile.TemporaryDirectory(prefix="raydiff-evaluation-tracking-") as local:
        trackers = open_trackers(
            config, run_dir=run_dir, local_dir=Path(local), start_step=0, role="evaluation"
        )
        try:
            if finite:
                trackers.log_scalars([Point(step, finite)])
            for name, image in (images or {}).items():
                trackers.log_image(f"eval/{name}", image, step=step)
        finally:
            trackers.close()
    return [tracker.where for tracker in trackers.trackers]
