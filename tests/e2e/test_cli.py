"""The real command line on the real embedded dataset (marked slow by directory)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FASHION = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")

needs_dataset = pytest.mark.skipif(
    not FASHION.exists(),
    reason="Fashion-MNIST is not installed: apt-get install -y dataset-fashion-mnist",
)


# Lines a user must not see from a run that went well (raydiff.orchestrate.ray_session): Ray
# Data's progress-bar notice, its false "will hang" alarm while the driver decodes the splits,
# Ray Core's ERROR lines (Ray Train's PreemptionWatcher's among them), tensorboardX renaming a
# metric with '@' (Tune's TensorBoard callback in a sweep), Train's state transitions, and
# deprecation warnings.
CONSOLE_NOISE = re.compile(
    r"Progress bars disabled|does not have any available CPUs|\bE \d+ \d+\] core_worker\.cc"
    r"|PreemptionWatcher|is illegal; using|\[State Transition\]|DeprecationWarning"
)


def noise_in(console: str) -> list[str]:
    """The lines of ``console`` that match ``CONSOLE_NOISE``."""
    return [line for line in console.splitlines() if CONSOLE_NOISE.search(line)]


def cli(*args: str, timeout: float) -> subprocess.CompletedProcess:
    # RAY_ADDRESS=local: a cluster of its own, whatever else runs on this machine.
    env = {
        **os.environ,
        "RAY_ADDRESS": "local",
        "RAY_AUTH_MODE": "disabled",
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
    }
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


@needs_dataset
def test_prepare_fashion_mnist_in_under_two_minutes(tmp_path):
    out = tmp_path / "fashion-mnist"
    start = time.monotonic()
    done = cli("jobs/prepare.py", "fashion-mnist", "--out", str(out), "--quiet", timeout=300)
    elapsed = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    assert elapsed < 120, f"prepare took {elapsed:.0f} s"
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["image_size"], manifest["channels"], manifest["num_images"]) == (32, 1, 70000)
    assert {k: v["num_rows"] for k, v in manifest["splits"].items()} == {
        "train": 59000,
        "val": 1000,
        "test": 10000,
    }
    assert len(manifest["classes"]) == 10
    again = cli("jobs/prepare.py", "fashion-mnist", "--out", str(out), "--quiet", timeout=60)
    assert again.returncode == 1 and "--overwrite" in again.stderr


@needs_dataset
def test_train_cli_on_two_ray_workers(tmp_path):
    data = tmp_path / "fm"
    assert (
        cli(
            "jobs/prepare.py",
            "fashion-mnist",
            "--out",
            str(data),
            "--quiet",
            "--limit",
            "2000",
            timeout=300,
        ).returncode
        == 0
    )
    out = tmp_path / "run"
    done = cli(
        "jobs/train.py",
        "--data",
        str(data),
        "--output",
        str(out),
        "--max-steps",
        "12",
        "--set",
        "train.log_interval=4",
        "--set",
        "train.save_interval=6",
        "--set",
        "train.eval_num_images=32",
        "--set",
        "train.eval_timesteps=2",
        "--set",
        "train.sample_count=16",
        "--set",
        "train.sample_steps=5",
        "--set",
        "scaling.cpus_per_worker=0.5",
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "final metrics: step 12" in done.stdout
    # Ray's own chatter stays in its log files (raydiff.orchestrate.ray_session; `raydiff -v` shows it).
    console = done.stdout + done.stderr
    assert noise_in(console) == [], console
    assert sorted(p.name for p in out.glob("checkpoint_0*")) == [
        "checkpoint_000006",
        "checkpoint_000012",
    ]
    assert (out / "samples" / "samples_000012.png").is_file()
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    config = json.loads((out / "checkpoint_000012" / "config.json").read_text())
    assert config["scaling"]["num_workers"] == 2 and config["model"]["in_channels"] == 1
