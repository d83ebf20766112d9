"""A sweep to S3 on Ray nodes that share no disk, tracked in MLflow, interrupted and resumed.

``raydiff sweep --output s3://...`` of Optuna's TPE over an upsampler's config (its input size
among the fields) runs as a driver on the head; its trials train on the worker nodes. It is
stopped by SIGTERM while its second trial trains (as a pod's stop sends it; the driver turns it
into Ctrl-C, so this is Ctrl-C's path too). Tune's state, the trials' runs and the results files
are in the bucket; ``raydiff sweep --resume s3://...`` reads Tune's state (Optuna's included)
back from there, continues the interrupted trial from its checkpoint and does not run the
finished one again; the folder is then refused to a new sweep. In MLflow (a server on the
cluster's network, artifacts uploaded through it) the sweep is one parent run with one child per
trial, each holding every step once, and the results table. (A failing trial, and the resume of
a finished sweep: tests/integration/test_sweep.py.)

This test process joins the cluster's network (``NetnsCluster.joined``) to read the bucket and
the MLflow server as a user beside the cluster would.
"""

from __future__ import annotations

import csv
import io
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from netns_cluster import BRIDGE_IP, NetnsCluster

pytestmark = pytest.mark.cluster

STEPS = 8


@pytest.fixture(scope="module")
def on_cluster_network(
    netns_cluster: NetnsCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """This process on the cluster's network, with an MLflow server there: its URI."""
    pytest.importorskip("mlflow")
    from mlflow_server import mlflow_server

    with (
        netns_cluster.joined(),
        mlflow_server(
            tmp_path_factory.mktemp("mlflow"), host=BRIDGE_IP, served_artifacts=True
        ) as uri,
    ):
        yield uri


def sweep_driver(cluster: NetnsCluster, *args: str) -> subprocess.Popen:
    """``raydiff sweep ARGS`` as a user on the head runs it."""
    return subprocess.Popen(
        cluster.driver_argv(["raydiff", "sweep", *args]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cluster.root,
    )


def test_an_interrupted_sweep_on_s3_resumes_from_the_bucket_as_one_mlflow_parent(
    netns_cluster: NetnsCluster, tiny_data, on_cluster_network: str, tmp_path, monkeypatch
):
    pytest.importorskip("optuna")
    sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
    from test_sweep import _wait_for as wait_for
    from test_sweep import write_base, write_sweep
    from test_tracking import mlflow_runs, steps_of

    from raydiff.storage import as_location

    for name, value in netns_cluster.s3_environment().items():
        monkeypatch.setenv(name, value)
    mlflow = on_cluster_network
    _, data = tiny_data
    head = netns_cluster.head
    base = write_base(tmp_path, data, upsampler=True)
    on_head = head.private / "sweep"
    netns_cluster.put(head, on_head / "tiny.yaml", base.read_text())
    # Optuna's TPE draws the trials: its state must come back with --resume as well.
    sweep = write_sweep(
        tmp_path,
        base=str(on_head / "tiny.yaml"),
        # No validation (what this checks is resume): the objective is the training loss.
        set={
            "max_steps": STEPS,
            "data.val_split": "",
            "tracking.backend": "tensorboard,mlflow",
            "tracking.mlflow_tracking_uri": mlflow,
            "tracking.mlflow_experiment": "sweep-on-s3",
        },
        search_space={"lr": {"loguniform": [1e-4, 1e-2]}, "small_size": {"choice": [4, 8]}},
        metric="loss",
        search="optuna",
        num_samples=2,
        max_concurrent_trials=1,
        scheduler={"name": "none"},
    )
    netns_cluster.put(head, on_head / "sweep.yaml", sweep.read_text())
    uri = f"s3://{netns_cluster.bucket}/sweeps/s1"
    server = netns_cluster.s3_server

    def keys() -> set[str]:
        prefix = "sweeps/s1/"
        return {k.removeprefix(prefix) for k in server.keys(netns_cluster.bucket, prefix)}

    def checkpoints(trial_prefix: str) -> list[str]:
        return sorted(
            k.removesuffix("/files.json")
            for k in keys()
            if k.startswith(f"trials/{trial_prefix}_") and k.endswith("/files.json")
        )

    first = sweep_driver(netns_cluster, "--config", str(on_head / "sweep.yaml"), "--output", uri)
    try:
        # Interrupted while the second trial trains (the first has finished).
        wait_for(lambda: checkpoints("t0001"), timeout=240, what="the second trial's checkpoint")
        finished = checkpoints("t0000")
        assert finished and finished[-1].endswith(f"/checkpoint_{STEPS:06d}"), finished
        finished_trial = finished[-1].rsplit("/", 1)[0]
        # A trial that starts rewrites its trial.json: the finished one must not start again.
        started = (as_location(uri) / finished_trial / "trial.json").read_text()
        first.send_signal(signal.SIGTERM)
        output, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    print(output)
    assert first.returncode == 143, output
    assert f"sweep interrupted by SIGTERM; continue it with: raydiff sweep --resume {uri}" in output
    assert "results.csv" not in keys()
    # The driver's own lines (its actors' are prefixed "(... pid=N)"; Tune's trial actors may
    # print Ray's own exit on the way out): no traceback, no C++ stack of Ray's handler.
    driver = [line for line in output.splitlines() if "pid=" not in line]
    assert not [line for line in driver if "Traceback" in line or "SIGTERM received" in line]

    again = sweep_driver(netns_cluster, "--resume", uri)
    output, _ = again.communicate(timeout=300)
    print(output)
    assert again.returncode == 0, output
    rows = list(csv.DictReader(io.StringIO((as_location(uri) / "results.csv").read_text())))
    assert [r["status"] for r in rows] == ["finished", "finished"]
    assert [int(r["steps"]) for r in rows] == [STEPS, STEPS]
    # Optuna's trial ids are random: the numbers come from the sweep's own counter.
    assert [r["trial"][:6] for r in rows] == ["t0000_", "t0001_"]
    for row in rows:
        assert 1e-4 <= float(row["lr"]) <= 1e-2 and row["small_size"] in ("4", "8")
    # The finished trial did not run again; the interrupted one continued its own run (or, when
    # SIGTERM came after its last checkpoint, found it finished and reported what it kept).
    assert (as_location(uri) / finished_trial / "trial.json").read_text() == started
    assert f"trial {rows[0]['trial']} started" not in output
    assert any(s in output for s in ("continuing from", "resumed from", "nothing to train"))

    good = f"trials/{rows[1]['trial']}"
    assert {
        "sweep.yaml",
        "base_config.yaml",
        "results.csv",
        "best_config.yaml",
        f"{good}/config.json",
        f"{good}/trial.json",
        f"{good}/checkpoint_{STEPS:06d}/model.pt",
    } <= keys(), sorted(keys())
    assert any(k.startswith(f"{good}/tensorboard/events.out.tfevents.") for k in keys())
    assert any(k.startswith("tune/") for k in keys())  # Tune's state, what --resume read
    best = yaml.safe_load((as_location(uri) / "best_config.yaml").read_text())
    assert best["train"]["max_steps"] == STEPS and best["train"]["task"] == "super_res"

    refused = sweep_driver(netns_cluster, "--config", str(on_head / "sweep.yaml"), "--output", uri)
    output, _ = refused.communicate(timeout=120)
    assert refused.returncode == 1 and "holds a sweep already" in output, output

    # Tracked: one parent run, a child per trial that logged each of its steps once (the
    # interrupted trial's steps after its checkpoint were trained again, not logged again).
    from mlflow.tracking import MlflowClient

    runs = mlflow_runs(mlflow, "sweep-on-s3")
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert [r.info.run_name for r in parents] == ["s1"], [r.info.run_name for r in runs]
    assert sorted(r.info.run_name for r in children) == [r["trial"] for r in rows]
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    for child in children:
        assert steps_of(mlflow, child.info.run_id, "loss_step") == list(range(1, STEPS + 1))
    artifacts = MlflowClient(mlflow).list_artifacts(parents[0].info.run_id)
    assert "results.csv" in [a.path for a in artifacts]
