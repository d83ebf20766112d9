"""Experiment tracking: one small interface (:class:`Tracker`), one module per backend
(:mod:`.tensorboard`, :mod:`.mlflow`, :mod:`.wandb`), chosen by ``tracking.backend``.

One tracked run per run folder, whatever happens to the run. The driver (a Ray run's, a
``--single-process`` run's, a sweep trial's) calls :func:`start_tracking` before anything trains:
it creates the backends' runs once and keeps their ids in ``RUN/tracking.json`` (written
atomically; a URI's too). The main rank (:func:`open_trackers`), and the checkpoint evaluator,
log into the runs named there, so a resumed run, a restarted worker group, an elastic resize and
a preemption continue the same tracked run.

A step is logged once: a tracker knows the last step its run holds (``logged_through``, read
when it opens), and steps up to it, trained again after a restart from an older checkpoint, are
not logged again (the run keeps the first values of those steps; MLflow keeps every value of a
step, so the rule must drop the second ones). TensorBoard drops the other way: its writer purges
the events past the checkpoint (``purge_step``), and the steps are written again.

A sweep is a parent run with a child per trial, a family one with a child per trained stage
(:func:`start_parent_tracking`: the parent's ids in the sweep's or family's folder's
``tracking.json``; the children's :func:`start_tracking` name it as their parent), and its
results table (a sweep's ``results.csv``, a family's ``report.csv``) goes to the parent
(:func:`finish_parent_tracking`). No Ray here.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from raydiff.config import ExperimentConfig
from raydiff.storage import StoragePath, write_text_atomically

if TYPE_CHECKING:
    from raydiff.tracking.tensorboard import TensorBoardTracker

TRACKING_FILE = "tracking.json"
"""``RUN/tracking.json`` (and a sweep folder's): ``key`` (this run's identity, tagged on its
tracked runs so that a driver killed between creating one and writing this file finds it again)
and each backend's entry (its run id and what it needs to log there again)."""


@dataclass(frozen=True)
class Point:
    """Metrics of one step (``wall_time``: when it was trained, default now)."""

    step: int
    values: Mapping[str, float]
    wall_time: float | None = None


class Tracker(Protocol):
    """One backend's tracked run, open for logging."""

    name: str
    logged_through: int
    """The last step the tracked run held when it was opened (-1: none)."""

    def log_scalars(self, points: Sequence[Point]) -> None:
        """Metrics at their steps (ascending): one report's, logged together."""
        ...

    def log_image(self, key: str, image: np.ndarray, *, step: int) -> None:
        """A uint8 ``[H, W, C]`` image (a grid) at ``step``."""
        ...

    def log_checkpoint(self, location: str, *, step: int) -> None:
        """Where the checkpoint of ``step`` is."""
        ...

    def flush(self, *, now: bool) -> None:
        """What the backend buffers, written out (``now``: whatever its interval)."""
        ...

    def close(self) -> None: ...


def read_state(folder: StoragePath) -> dict[str, Any]:
    """``folder``'s ``tracking.json`` ({} when it has none)."""
    path = folder / TRACKING_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def write_state(folder: StoragePath, state: Mapping[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)  # nothing to do on an object store
    write_text_atomically(folder / TRACKING_FILE, json.dumps(state, indent=2) + "\n")


def flat_params(config: ExperimentConfig) -> dict[str, str]:
    """The resolved config as ``section.field`` -> its value as text."""
    from raydiff.config import to_dict

    return {
        f"{section}.{name}": str(value)
        for section, fields in to_dict(config).items()
        for name, value in fields.items()
    }


def _backend(name: str) -> Any:
    """The module of backend ``name`` (imported when chosen: each is an optional extra)."""
    import importlib

    return importlib.import_module(f"raydiff.tracking.{name}")


def start_tracking(
    config: ExperimentConfig,
    *,
    run_dir: StoragePath,
    parent: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Create the run's tracked runs, or find them in ``RUN/tracking.json``; the state written
    there. ``parent``: a sweep's state (:func:`start_parent_tracking`), whose runs are the
    parents. Called by the driver before anything trains."""
    return _start(config, folder=run_dir, parent=parent, sweep=False)


def start_parent_tracking(config: ExperimentConfig, *, sweep_dir: StoragePath) -> dict[str, Any]:
    """A sweep's or a family's parent runs (created once, found again when it continues)."""
    return _start(config, folder=sweep_dir, parent=None, sweep=True)


def _start(
    config: ExperimentConfig,
    *,
    folder: StoragePath,
    parent: Mapping[str, Any] | None,
    sweep: bool,
) -> dict[str, Any]:
    if config.tracking.backends == ("tensorboard",):
        return {}  # TensorBoard's events are the run folder's own: nothing to keep
    state = read_state(folder)
    if "key" not in state:  # first: a run created after this is found by it again
        state["key"] = uuid.uuid4().hex
        write_state(folder, state)
    for name in config.tracking.backends:
        if name == "tensorboard":
            continue  # its files are the run folder's
        entry = _backend(name).start(
            config,
            folder=folder,
            key=state["key"],
            entry=state.get(name),
            parent=(parent or {}).get(name),
            sweep=sweep,
        )
        if entry != state.get(name):
            state[name] = entry
            write_state(folder, state)
    return state


def finish_parent_tracking(
    config: ExperimentConfig, *, sweep_dir: StoragePath, results_csv: StoragePath
) -> None:
    """A sweep's or a family's results table, as an artifact of its parent runs."""
    state = read_state(sweep_dir)
    for name in config.tracking.backends:
        if name in state:
            _backend(name).log_results(state[name], results_csv=results_csv, folder=sweep_dir)


class Trackers:
    """The main rank's trackers of one run: each step is logged once to each (see the module
    docstring)."""

    def __init__(self, trackers: Sequence[Tracker]) -> None:
        self.trackers = list(trackers)

    @property
    def tensorboard(self) -> TensorBoardTracker | None:
        """The TensorBoard tracker, for what only it shows (histograms)."""
        return next((t for t in self.trackers if t.name == "tensorboard"), None)  # type: ignore[return-value]

    def log_scalars(self, points: Sequence[Point]) -> None:
        for tracker in self.trackers:
            new = [p for p in points if p.step > tracker.logged_through]
            if new:
                tracker.log_scalars(new)

    def log_image(self, key: str, image: np.ndarray, *, step: int) -> None:
        for tracker in self.trackers:
            if step > tracker.logged_through:
                tracker.log_image(key, image, step=step)

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
    role: str = "training",
) -> Trackers:
    """The trackers of the run in ``run_dir`` (its tracked runs: :func:`start_tracking`), open
    for logging. ``local_dir``: the run's local folder (a URI's staging folder), where
    TensorBoard and W&B write their files; ``start_step``: the step the run continues from;
    ``role``: 'training' (the main rank), or 'evaluation' (the checkpoint evaluator: the
    backends other than TensorBoard, which has its own evaluation events)."""
    state = read_state(run_dir) if config.tracking.backends != ("tensorboard",) else {}
    trackers = []
    for name in config.tracking.backends:
        if name == "tensorboard":
            if role == "training":
                trackers.append(_backend(name).open_tracker(local_dir, start_step=start_step))
            continue
        if name not in state:
            raise RuntimeError(
                f"{run_dir}/{TRACKING_FILE} names no {name} run: the driver starts the tracked "
                "runs (start_tracking) before the workers"
            )
        trackers.append(
            _backend(name).open_tracker(
                config, state[name], run_dir=run_dir, local_dir=local_dir, role=role
            )
        )
    return Trackers(trackers)
