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
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from s3_server import S3Server

REPO = Path(__file__).resolve().parents[2]
MLFLOW_START_TIMEOUT_S = 120


@dataclass(frozen=True)
class TinyDataset:
    """What ``tiny_dataset`` made (tests read these instead of importing this conftest)."""

    path: Path
    image_size: int = 16
    channels: int = 1
    num_classes: int = 10
    num_train: int = 288  # 288 train + 32 val: both split evenly over 2 workers and batch 16
    num_val: int = 32


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
    """A prepared 16x16x1, 10-class dataset: 288 train and 32 val rows in 16-row shards.

    Made from an .npz whose pixel (0, 0) holds the class id, so tests can check labels against
    pixels. Many small shards give many blocks, so block-order shuffling is visible.
    """
    from raydiff.data import PrepareOptions, prepare_dataset

    root = tmp_path_factory.mktemp("tiny")
    tiny = TinyDataset(path=root / "dataset")
    num_images = tiny.num_train + tiny.num_val
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (num_images, tiny.image_size, tiny.image_size), np.uint8)
    labels = np.arange(num_images) % tiny.num_classes
    images[:, 0, 0] = labels
    np.savez(root / "tiny.npz", images, labels)
    prepare_dataset(
        PrepareOptions(
            source=str(root / "tiny.npz"),
            out=str(tiny.path),
            image_size=tiny.image_size,
            channels=tiny.channels,
            val_count=tiny.num_val,
            shard_max_rows=16,
            num_workers=1,
            progress=False,
        )
    )
    return tiny


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
    """``mlflow server`` on a free port (sqlite backend, artifacts in a local folder): its URI.
    One for the session: each test logs to an experiment of its own."""
    pytest.importorskip("mlflow")
    from test_job_submit import free_ports

    root = tmp_path_factory.mktemp("mlflow")
    (port,) = free_ports(1)
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true")
    log = (root / "server.log").open("w")
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "mlflow", "server", "--workers", "1"),
            *("--host", "127.0.0.1", "--port", str(port)),
            *("--backend-store-uri", f"sqlite:///{root}/mlflow.db"),
            *("--default-artifact-root", f"file:{root}/artifacts"),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: stopped whole at the end
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + MLFLOW_START_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"mlflow server did not start: {(root / 'server.log').read_text()}"
                )
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()
