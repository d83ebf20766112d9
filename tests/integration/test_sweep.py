"""Ray Tune sweeps on the shared local cluster: tiny models, tiny real shards.

A 3-trial sweep runs to the end with ASHA stopping the bad trial early and a diverging trial
marked failed while the sweep goes on; its results files list exactly the trials that ran, and
``--resume`` of the ended sweep runs none of them again. A sweep of Optuna's TPE interrupted with
Ctrl-C and continued with ``--resume`` is tested on S3, on nodes that share no disk
(tests/cluster/test_sweep_on_s3.py).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def write_base(tmp_path: Path, data_dir: Path, *, upsampler: bool = False) -> Path:
    """A tiny training config (16x16x1, one Ray Train worker per trial); with ``upsampler``
    a 4x4 -> 16x16 upsampler's."""
    base: dict = {
        "model": {
            "image_size": 16,
            "in_channels": 1,
            "num_channels": 32,
            "channel_mult": "1,2",
            "num_res_blocks": 1,
            "attention_resolutions": "8",
        },
        "diffusion": {"diffusion_steps": 100, "noise_schedule": "cosine"},
        "optim": {"lr": 1e-3, "ema_rate": "0.5"},
        "train": {
            "batch_size": 8,
            "max_steps": 16,
            "log_interval": 4,
            "save_interval": 4,
            "eval_interval": 4,
            "eval_num_images": 16,
            "eval_timesteps": 4,
            "sample_count": 4,
            "sample_steps": 4,
        },
        "data": {"data_dir": str(data_dir)},
        "scaling": {"num_workers": 1, "cpus_per_worker": 0.5, "max_failures": 0},
    }
    if upsampler:
        base["train"]["task"] = "super_res"
        base["super_res"] = {"small_size": 4}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(base))
    return path


def write_sweep(tmp_path: Path, **sweep: object) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def read_results(out: Path) -> list[dict[str, str]]:
    with (out / "results.csv").open() as f:
        return list(csv.DictReader(f))


def test_asha_stops_a_bad_trial_a_diverging_one_fails_and_resume_runs_none_again(
    ray_cluster, tiny_dataset, tmp_path
):
    from raydiff.config import load_config
    from raydiff.orchestrate.sweep import resume_sweep, start_sweep
    from raydiff.sweep.spec import load_sweep

    base = write_base(tmp_path, tiny_dataset.path)
    # lr 3e-3 learns in 8 steps, lr 1e-7 learns nothing: one seed for every trial, so validation
    # noise is the same and only the weights differ. One trial at a time, the good one first, so
    # that ASHA has the good trial's step-8 result to compare the bad one with (it never stops
    # the first trial to reach a rung): the stop is certain, not a race between trials. lr 1e30
    # diverges: its second step's gradients are not finite, and one such step ends a run here.
    sweep = write_sweep(
        tmp_path,
        base=str(base),
        set={"seed": 0, "max_consecutive_skipped": 1},
        search_space={"lr": {"grid": [3e-3, 1e-7, 1e30]}},
        max_concurrent_trials=1,
        scheduler={"name": "asha", "grace_period": 8, "reduction_factor": 2},
    )
    out = tmp_path / "sweep_out"
    outcome = start_sweep(load_sweep(sweep), output_dir=out)
    print(outcome.table)

    assert not outcome.interrupted
    rows = read_results(out)
    trial_dirs = sorted(p.name for p in (out / "trials").iterdir())
    assert [r["trial"] for r in rows] == trial_dirs and len(rows) == 3
    assert [float(r["lr"]) for r in rows] == [3e-3, 1e-7, 1e30]
    assert [r["status"] for r in rows[:2]] == ["finished", "stopped early"]
    # The failing trial is marked failed, with its error, while the sweep went on.
    assert rows[2]["status"].startswith("failed: ") and "non-finite" in rows[2]["status"], rows[2]
    assert int(rows[0]["steps"]) == 16 and 8 <= int(rows[1]["steps"]) < 16
    for row in rows[:2]:
        assert float(row["val_bpd"]) > 0 and float(row["loss"]) > 0
        # Every trial keeps its last checkpoint and its TensorBoard events.
        assert Path(row["checkpoint"]).is_dir()
        assert list((Path(row["run_dir"]) / "tensorboard").glob("events.out.tfevents.*"))
    for row in rows:
        # Which trial the run is, and when it started (bench/sweep_overhead.py reads it).
        info = json.loads((Path(row["run_dir"]) / "trial.json").read_text())
        assert info["params"] and 0 < time.time() - info["started"] < 600

    best = min(rows[:2], key=lambda r: float(r["val_bpd"]))
    assert float(best["lr"]) == 3e-3
    config = load_config(str(out / "best_config.yaml"))  # `raydiff train --config` takes it
    assert config.optim.lr == 3e-3 and config.train.max_steps == 16
    assert outcome.best_checkpoint == best["checkpoint"]
    assert "*" in outcome.table and "stopped early" in outcome.table
    _assert_nothing_left_behind()

    # --resume of a sweep that ended: no trial starts again (a trial that starts rewrites its
    # trial.json), neither the finished, the stopped nor the failed one.
    started = {row["trial"]: (Path(row["run_dir"]) / "trial.json").read_text() for row in rows}
    again = resume_sweep(out)
    assert [r.status for r in again.rows] == [r["status"] for r in rows]
    assert {
        row["trial"]: (Path(row["run_dir"]) / "trial.json").read_text() for row in rows
    } == started


def test_a_classifier_sweep_reports_its_own_objective_and_writes_its_best_config(
    ray_cluster, tiny_dataset, tmp_path
):
    """No metric or mode in the sweep file: the classifier's own objective (val_acc@1, max) is
    the row's column and names the best trial, and its best_config.yaml trains with
    ``raydiff train-classifier --config``. One trial: ranking several is the ASHA test's."""
    from tiny_model import tiny_classifier

    from raydiff.cli import main
    from raydiff.config import read_config
    from raydiff.orchestrate.sweep import start_sweep
    from raydiff.sweep.spec import load_sweep

    base = yaml.safe_load(write_base(tmp_path, tiny_dataset.path).read_text())
    classifier = read_config(None, tiny_classifier(image_size=16))
    for section, fields in classifier.items():
        base.setdefault(section, {}).update(fields)
    base["train"].update(max_steps=8, save_interval=8)
    (tmp_path / "classifier.yaml").write_text(yaml.safe_dump(base))
    sweep = write_sweep(
        tmp_path,
        base=str(tmp_path / "classifier.yaml"),
        set={"seed": 0},
        search_space={"lr": {"grid": [3e-3]}},
        scheduler={"name": "none"},
    )
    loaded = load_sweep(sweep)
    assert (loaded.sweep.metric, loaded.sweep.mode) == ("val_acc@1", "max")
    out = tmp_path / "sweep_out"
    outcome = start_sweep(loaded, output_dir=out)
    print(outcome.table)
    rows = read_results(out)
    assert [r["status"] for r in rows] == ["finished"]
    header = outcome.table.splitlines()[0].split()
    assert header[:3] == ["trial", "lr", "val_acc@1"] and "val_bpd" not in header
    for row in rows:
        assert 0 <= float(row["val_acc@1"]) <= 1 and float(row["val_loss"]) > 0
    assert "* best val_acc@1 (max)" in outcome.table
    best = out / "best_config.yaml"
    assert "raydiff train-classifier --config" in best.read_text()
    run = tmp_path / "from_best"
    argv = ["train-classifier", "--config", str(best), "--single-process", "--max-steps", "2"]
    assert main([*argv, "--output", str(run)]) == 0
    assert (run / "checkpoint_000002").is_dir()


def _assert_nothing_left_behind() -> None:
    """Trials stopped early leave no placement group or loss-history actor holding resources."""
    import ray
    from ray.util import placement_group_table

    deadline = time.monotonic() + 30
    while True:
        live = [pg for pg in placement_group_table().values() if pg["state"] != "REMOVED"]
        actors = [
            n for n in ray.util.list_named_actors(all_namespaces=True) if "loss-history" in str(n)
        ]
        if not live and not actors:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"left behind: placement groups {live}, actors {actors}")
        time.sleep(1)


def _sweep_cli(*args: str) -> subprocess.Popen:
    """``raydiff sweep ARGS`` as a user runs it, on the test cluster."""
    import ray

    env = dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address)
    return subprocess.Popen(
        [sys.executable, "-m", "raydiff.cli", "sweep", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for(condition, *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)
