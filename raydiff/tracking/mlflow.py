"""MLflow (``pip install 'raydiff[mlflow]'``): one MLflow run per run folder, through
``MlflowClient`` (no fluent API: no process-global active run); what it holds: docs/tracking.md.
``raydiff.logged_through`` is set in the same ``log_batch`` as its step's metrics, which the
tracking store writes at once or not at all.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raydiff.config import ExperimentConfig
from raydiff.storage import StoragePath, local_copy
from raydiff.tracking import Point, Role, flat_params, greyscale_2d

logger = logging.getLogger(__name__)

KEEPS_RUNS = True

KEY_TAG = "raydiff.key"
LOGGED_THROUGH_TAG = "raydiff.logged_through"
MAX_METRICS_PER_BATCH = 1000  # MLflow's log_batch limits
MAX_PARAMS_PER_BATCH = 100


def _client(tracking_uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def start(
    config: ExperimentConfig,
    *,
    folder: StoragePath,
    key: str,
    entry: Mapping[str, Any] | None,
    parent: Mapping[str, Any] | None,
    sweep: bool,
) -> dict[str, Any]:
    """The folder's MLflow run: the one its entry names, else the one tagged with its ``key``
    (a driver that stopped before writing the entry), else a new one (a parent's child)."""
    if entry is not None:
        return dict(entry)
    import mlflow

    options = config.tracking
    uri = options.mlflow_tracking_uri or mlflow.get_tracking_uri()  # resolved here: workers
    client = _client(uri)  # run elsewhere, in other folders
    if parent is not None:
        experiment_id = parent["experiment_id"]
    else:
        experiment = client.get_experiment_by_name(options.mlflow_experiment)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else client.create_experiment(options.mlflow_experiment)
        )
    found = client.search_runs([experiment_id], filter_string=f"tags.`{KEY_TAG}` = '{key}'")
    if found:
        run_id = found[0].info.run_id
    else:
        tags = {KEY_TAG: key, "raydiff.folder": str(folder)}
        if parent is not None:
            tags["mlflow.parentRunId"] = parent["run_id"]
        run = client.create_run(experiment_id, run_name=folder.name, tags=tags)
        run_id = run.info.run_id
        if not sweep:
            from mlflow.entities import Param

            params = [Param(k, v) for k, v in flat_params(config).items()]
            for i in range(0, len(params), MAX_PARAMS_PER_BATCH):
                client.log_batch(run_id, params=params[i : i + MAX_PARAMS_PER_BATCH])
    logger.info("MLflow run %s (experiment %s, %s)", run_id, experiment_id, uri)
    return {"run_id": run_id, "experiment_id": experiment_id, "tracking_uri": uri}


class MlflowTracker:
    """Logs into the run an entry of ``tracking.json`` names."""

    def __init__(
        self, config: ExperimentConfig, entry: Mapping[str, Any], *, role: Role, **_: Any
    ) -> None:
        self.client = _client(entry["tracking_uri"])
        self.run_id = entry["run_id"]
        self.role = role
        self.where = f"mlflow: run {self.run_id} at {entry['tracking_uri']}"
        self.logged_through = -1  # the evaluator's: each checkpoint is evaluated once
        if role == "training":
            tags = self.client.get_run(self.run_id).data.tags
            self.logged_through = int(tags.get(LOGGED_THROUGH_TAG, -1))
            self.client.update_run(self.run_id, status="RUNNING")  # again, when resumed

    def log_scalars(self, points: Sequence[Point]) -> None:
        from mlflow.entities import Metric

        # Whole steps per batch: the tag is set in the batch that holds its step's metrics.
        batch: list[Metric] = []
        for point in sorted(points, key=lambda p: p.step):
            if len(batch) + len(point.values) > MAX_METRICS_PER_BATCH:
                self._log_batch(batch, last_step=batch[-1].step)
                batch = []
            stamp = int((point.wall_time or time.time()) * 1000)
            batch += [
                Metric(_metric_name(k), float(v), stamp, point.step)
                for k, v in point.values.items()
            ]
        if batch:
            self._log_batch(batch, last_step=batch[-1].step)

    def _log_batch(self, metrics: list[Any], *, last_step: int) -> None:
        from mlflow.entities import RunTag

        tags = [RunTag(LOGGED_THROUGH_TAG, str(last_step))] if self.role == "training" else []
        self.client.log_batch(self.run_id, metrics=metrics, tags=tags)

    def log_image(self, key: str, image: np.ndarray, *, step: int) -> None:
        self.client.log_image(self.run_id, greyscale_2d(image), key=key, step=step)

    def log_histogram(self, key: str, values: np.ndarray, *, step: int) -> None:
        pass  # MLflow has no histograms

    def log_checkpoint(self, location: str, *, step: int) -> None:
        self.client.set_tag(self.run_id, Path(str(location)).name, str(location))

    def flush(self, *, now: bool) -> None:
        pass  # every call is written when it returns

    def close(self) -> None:
        if self.role == "training":
            self.client.set_terminated(self.run_id, status="FINISHED")


def _metric_name(key: str) -> str:
    """``key`` in the characters MLflow takes (a classifier's ``acc@1``: ``acc_1``)."""
    return re.sub(r"[^\w\-. :/]", "_", key)


open_tracker = MlflowTracker  # the Backend protocol's name for it


def log_results(entry: Mapping[str, Any], *, results_csv: StoragePath, folder: StoragePath) -> None:
    """A sweep's ``results.csv`` as an artifact of its parent run, which then ends."""
    client = _client(entry["tracking_uri"])
    with local_copy(results_csv) as path:
        client.log_artifact(entry["run_id"], str(path))
    client.set_terminated(entry["run_id"], status="FINISHED")
