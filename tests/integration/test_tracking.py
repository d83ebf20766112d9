"""Experiment tracking against the real thing: an MLflow tracking server (conftest.py's
``mlflow_server``: a subprocess, SQL backend, local artifact store) read back through
``MlflowClient``, and W&B's offline run files.

1. A 2-worker run whose rank 0 is killed at step 7 (SIGKILL: Ray Train restarts the worker group
   from checkpoint 4, and steps 5-6 are trained again) is one MLflow run holding every step once,
   the config's values as params, the preview grids, the checkpoint evaluations and where each
   checkpoint is.
2. A family's tracking: one parent, a child per training stage. (A sweep stopped by SIGTERM and
   resumed, one parent with a child per trial: tests/cluster/test_sweep_on_s3.py, on S3.)
3. W&B offline: a run continued from an older checkpoint than its last logged step (steps 3-4
   trained again) logs each step once into one W&B run, read back from its ``.wandb`` files.
4. ``raydiff evaluate fid`` of samples drawn from a tracked run's checkpoint logs into that
   run's MLflow run.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_training import tiny_config

from raydiff.config import ExperimentConfig, from_dict
from raydiff.tracking import TRACKING_FILE, flat_params

pytestmark = pytest.mark.integration


def mlflow_runs(uri: str, experiment: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r}"
    return client.search_runs([found.experiment_id])


def steps_of(uri: str, run_id: str, key: str) -> list[int]:
    from mlflow.tracking import MlflowClient

    return sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, key))


def test_a_run_with_a_killed_worker_is_one_mlflow_run_with_every_step_once(
    ray_cluster: None, tiny_dataset, mlflow_server: str, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    from raydiff.orchestrate.training_job import run_training_job

    killed = tmp_path / "killed"  # the killed worker's pid: the kill happens once

    def killed_at_step_7(config: ExperimentConfig, *, runtime: Any) -> Any:
        """The diffusion task, whose rank 0 of the first worker group kills its own process in
        step 7 (one losses call per step: no microbatches), after logging steps 1-6."""
        from raydiff.train.tasks import task_of_config

        task = task_of_config(config, runtime=runtime)
        if runtime.rank == 0 and not killed.exists():
            losses, calls = task.losses, itertools.count(1)

            def losses_until_killed(model, batch, t):
                if next(calls) == 7:
                    killed.write_text(str(os.getpid()))
                    os.kill(os.getpid(), signal.SIGKILL)
                return losses(model, batch, t)

            task.losses = losses_until_killed
        return task

    config = from_dict(
        ExperimentConfig,
        tiny_config(
            tiny_dataset.path,
            **{
                "train.max_steps": 8,
                "train.log_interval": 1,
                "train.save_interval": 4,
                "train.eval_interval": 4,
                "train.sample_interval": 4,
                "data.val_split": "val",
                "scaling.max_failures": 2,
                "evaluation.every_checkpoint": True,
                "evaluation.num_samples": 4,
                "evaluation.sample_respacing": "ddim4",
                "evaluation.bpd_images": 2,
                "evaluation.cpus": 0.5,
                "tracking.backend": "tensorboard,mlflow",
                "tracking.mlflow_tracking_uri": mlflow_server,
                "tracking.mlflow_experiment": "killed-worker",
            },
        ),
    )
    out = tmp_path / "run"
    result = run_training_job(config, output_dir=out, make_task=killed_at_step_7)
    assert result["step"] == 8
    assert killed.exists(), "rank 0 was not killed"

    runs = mlflow_runs(mlflow_server, "killed-worker")
    assert len(runs) == 1, [r.info.run_name for r in runs]
    run = runs[0]
    assert json.loads((out / TRACKING_FILE).read_text())["mlflow"]["run_id"] == run.info.run_id
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    run_id = run.info.run_id
    for key in ("loss_step", "loss", "mse", "lr", "images_per_s"):
        assert steps_of(mlflow_server, run_id, key) == list(range(1, 9)), key
    assert steps_of(mlflow_server, run_id, "val_bpd") == [4, 8]
    # The checkpoint evaluations, logged by the evaluator actor.
    assert steps_of(mlflow_server, run_id, "eval/bpd_val") == [4, 8]
    params = MlflowClient(mlflow_server).get_run(run_id).data.params
    assert params == flat_params(config)
    assert params["train.max_steps"] == "8" and params["model.num_channels"] == "32"
    tags = run.data.tags
    assert tags["checkpoint_000004"] == str(out / "checkpoint_000004")
    assert tags["checkpoint_000008"] == str(out / "checkpoint_000008")
    images = [a.path for a in MlflowClient(mlflow_server).list_artifacts(run_id, "images")]
    assert any("samples" in p for p in images) and any("eval" in p for p in images), images


def test_a_family_is_one_parent_with_a_child_per_stage(mlflow_server: str, tmp_path: Path) -> None:
    """The family's tracking before its stages start (and again when it continues): one parent
    named after its folder, each training stage's run its child, created in the stage's run
    folder, where the stage's command finds it; the report's table goes to the parent."""
    from mlflow.tracking import MlflowClient

    from raydiff.family.spec import load_family
    from raydiff.orchestrate.family import start_family_tracking
    from raydiff.tracking import finish_parent_tracking, read_state

    tracking = [
        "tracking.backend=tensorboard,mlflow",
        f"tracking.mlflow_tracking_uri={mlflow_server}",
    ]
    tracking.append("tracking.mlflow_experiment=family")
    family = load_family("family_demo", overrides=tracking)
    out = tmp_path / "family_run"
    config = start_family_tracking(family, out=out)
    assert start_family_tracking(family, out=out) == config  # continued: the same runs
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("family")
    runs = client.search_runs([experiment.experiment_id])
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert parent.info.run_name == "family_run"
    children = {r.info.run_name: r for r in runs if r is not parent}
    assert sorted(children) == ["base", "classifier", "evaluator", "upsampler"]
    for name, child in children.items():
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert read_state(out / name)["mlflow"]["run_id"] == child.info.run_id
        assert child.data.params["train.max_steps"] == str(
            family.stages[name].config.train.max_steps
        )
    (out / "report.csv").write_text("name,fd\nfamily,36.5\n")
    finish_parent_tracking(config, sweep_dir=out, results_csv=out / "report.csv")
    assert [a.path for a in client.list_artifacts(parent.info.run_id)] == ["report.csv"]


def test_an_evaluation_of_a_tracked_runs_samples_is_in_its_mlflow_run(
    mlflow_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    """The FID of samples whose ``sampling.json`` names a run's checkpoint (a stand-in
    Inception; no training: the run folder is what its driver and a checkpoint leave) goes to
    the run's MLflow run at the checkpoint's step."""
    import numpy as np
    from mlflow.tracking import MlflowClient
    from tiny_model import TinyFeatures

    from raydiff.cli import main
    from raydiff.config import apply_overrides, to_dict
    from raydiff.evaluate import fid
    from raydiff.sample.outputs import SAMPLING_RECORD, write_npz
    from raydiff.tracking import start_tracking

    monkeypatch.setattr(fid, "load_inception", lambda path, device="cpu": TinyFeatures())
    config = apply_overrides(
        ExperimentConfig(),
        [
            "tracking.backend=mlflow",
            f"tracking.mlflow_tracking_uri={mlflow_server}",
            "tracking.mlflow_experiment=evaluated",
        ],
    )
    run, checkpoint = tmp_path / "run", tmp_path / "run" / "checkpoint_000004"
    checkpoint.mkdir(parents=True)
    for folder in (run, checkpoint):
        (folder / "config.json").write_text(json.dumps(to_dict(config)))
    run_id = start_tracking(config, run_dir=run)["mlflow"]["run_id"]
    rng = np.random.default_rng(0)
    reference = write_npz(rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8), tmp_path / "ref")
    samples = tmp_path / "samples"
    write_npz(rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8), samples)
    (samples / SAMPLING_RECORD).write_text(json.dumps({"checkpoint": str(checkpoint)}))

    argv = ["evaluate", "fid", "--samples", str(samples), "--reference", str(reference)]
    assert main([*argv, "--split", "val"]) == 0
    written = json.loads((samples / "fid_val.json").read_text())
    [logged] = MlflowClient(mlflow_server).get_metric_history(run_id, "eval/fid_val")
    assert (logged.step, logged.value) == (4, pytest.approx(written["fid"]))
    assert f"mlflow: run {run_id} at {mlflow_server}" in capsys.readouterr().out


def wandb_records(path: Path) -> Iterator[Any]:
    """The records of a ``.wandb`` file: W&B's protobuf ``Record`` messages (the public
    ``wandb.proto`` module) in LevelDB's log framing (32 KiB blocks of chunks, each a 7-byte
    header: CRC32C, length, type full/first/middle/last), after W&B's 7-byte file header. W&B
    offline keeps everything there; its Python reader left the package with wandb-core."""
    from wandb.proto import wandb_internal_pb2

    data, block, position, pending = path.read_bytes(), 32768, 7, b""
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header: padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if length == 0 and kind == 0:
            break
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def finished_records(path: Path, *, timeout: float = 30.0) -> list[Any]:
    """The records of a finished W&B run's ``.wandb`` file: the last is its ``exit`` record.
    W&B's own process may still be writing the file when ``run.finish()`` has returned, so a
    file without it (or with a half-written last record) is read again until the timeout."""
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + timeout
    while True:
        try:
            records = list(wandb_records(path))
            if records and records[-1].WhichOneof("record_type") == "exit":
                return records
        except DecodeError:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} has no exit record after {timeout:.0f} s")
        time.sleep(0.2)


def item_key(item: Any) -> str:
    """A record item's key (W&B writes it as ``nested_key`` parts or as ``key``)."""
    return item.key or "/".join(item.nested_key)


def test_wandb_offline_continues_one_run_and_logs_each_step_once(
    tiny_dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A single-process run to step 4 (checkpoints 2 and 4), its checkpoint 4 removed, then
    continued to step 6: steps 3-4 are trained again from checkpoint 2 and not logged again."""
    pytest.importorskip("wandb")
    import shutil

    from raydiff.train.local import run_single_process

    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)  # 'auto': offline

    def config(max_steps: int) -> ExperimentConfig:
        settings = {
            "train.max_steps": max_steps,
            "train.log_interval": 1,
            "train.save_interval": 2,
            "train.sample_interval": 2,
            "tracking.backend": "wandb",
            "tracking.wandb_project": "raydiff-test",
        }
        return from_dict(ExperimentConfig, tiny_config(tiny_dataset.path, **settings))

    out = tmp_path / "run"
    run_single_process(config(4), output_dir=out)
    shutil.rmtree(out / "checkpoint_000004")
    run_single_process(config(6), output_dir=out)

    state = json.loads((out / TRACKING_FILE).read_text())["wandb"]
    assert state["mode"] == "offline" and state["logged_through"] == 6
    files = sorted((tmp_path / "wandb-dir").glob(f"wandb/offline-run-*-{state['run_id']}/*.wandb"))
    assert len(files) == 2, files  # one per process that logged: `wandb sync` joins them
    steps, runs, config_items = [], set(), {}
    for file in files:
        for record in finished_records(file):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                runs.add((record.run.run_id, record.run.project))
                config_items.update({item_key(i): i.value_json for i in record.run.config.update})
            elif kind == "history":
                items = {item_key(i): i.value_json for i in record.history.item}
                if "loss_step" in items:
                    steps.append(int(items["_step"]))
    assert runs == {(state["run_id"], "raydiff-test")}
    assert steps == [1, 2, 3, 4, 5, 6]
    assert json.loads(config_items["train.max_steps"]) in ("4", "6", 4, 6)
    assert not (out / "tensorboard").exists()  # not among the trackers
