"""One real local Ray cluster for the whole integration session, a tiny prepared dataset, one
short training run for the tests that only need *a* run (scraped by a Prometheus server while it
trains), and one MLflow tracking server.

Starting Ray costs 2-3 s and a Train run 10-20 s here, so every integration test shares the
``ray_cluster`` fixture instead of starting its own. The cluster claims 4 logical CPUs on a
2-core machine so that two Train workers at 0.5 CPU leave room for Ray Data's read and decode
tasks (docs/operations.md, "CPUs for Ray Data": workers that take every CPU starve Ray Data).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3_server import S3Server
from tiny_dataset import TinyDataset, make_tiny_dataset

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A local Ray instance (``start_local_ray(num_cpus=4)``) once per session; shut down at the end."""
    # Set before ray.init: the raylet and every worker inherit this environment.
    os.environ["RAY_AUTH_MODE"] = "disabled"  # throwaway cluster: no token files
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")  # report() is a barrier
    # MLflow's usage telemetry (tests/integration/test_tracking.py): no network calls here.
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # Workers import raydiff (and the functions Ray ships to them) from the checkout.
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))

    import ray.data

    from raydiff.orchestrate.ray_session import start_local_ray

    start_local_ray(
        num_cpus=4,
        # As on a real cluster: Ray Train's PlacementGroupCleaner asks the dashboard's state
        # API whether a run's controller died; without it the placement groups of sweep trials
        # that Tune stopped are never removed.
        include_dashboard=True,
        log_to_driver=False,
        logging_level=logging.WARNING,
        configure_logging=True,
    )
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> TinyDataset:
    """tests/tiny_dataset.py's dataset, prepared once for the session."""
    return make_tiny_dataset(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def two_worker_run(
    ray_cluster: None, tiny_dataset: TinyDataset, tmp_path_factory: pytest.TempPathFactory
):
    """One short 2-worker training run (test_training.two_worker_run_in) shared by the tests that
    check what it leaves: its files (test_training.py), its Prometheus gauges (test_metrics.py)
    and every dashboard panel's series in a Prometheus server that scraped it while it ran
    (test_dashboard_prometheus.py; the server stops once they are read). Its folder name, the
    run's metrics tag, is unique to this session."""
    from test_dashboard_prometheus import start_prometheus
    from test_training import two_worker_run_in

    out = tmp_path_factory.mktemp("two_workers") / f"run-{uuid.uuid4().hex[:8]}"
    with start_prometheus(tmp_path_factory.mktemp("prometheus")) as prometheus:
        return two_worker_run_in(out, tiny_dataset.path, prometheus=prometheus)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A SeaweedFS S3 server on 127.0.0.1 for the session (tests/s3_server.py: credentials
    enforced, one bucket); each test writes under a prefix of its own."""
    from s3_server import seaweedfs

    with seaweedfs(tmp_path_factory.mktemp("s3")) as server:
        yield server


AWS_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_PROFILE",
)


@pytest.fixture
def s3_bucket(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """The session's S3 bucket, and the AWS variables pointing at it (this test's only: set
    after ``ray_cluster`` started, so Ray's workers never see them, as on a cluster started
    without them)."""
    for name in AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    return s3_server.buckets[0]


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """tests/mlflow_server.py's server on 127.0.0.1 for the session: its URI. Each test logs to
    an experiment of its own."""
    pytest.importorskip("mlflow")
    from mlflow_server import mlflow_server

    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri
