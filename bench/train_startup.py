"""Where a Ray Train run's start-up goes: seconds from ``run_training_job`` to its first step.

Runs ``--runs`` tiny training runs (16x16x1, 2 steps, one worker by default) one after another
on one local Ray instance (raydiff's ``start_local_ray(num_cpus=4)``, as the integration tests
start theirs) and splits each run's time into phases, from three clocks that need no change to
raydiff's code:

* the driver: when ``run_training_job`` was called and when it returned;
* Ray Train's controller log (``SESSION/logs/train/ray-train-sys-controller-*.log``): when the
  controller began starting the worker group, and the durations it logs for creating the worker
  actors, initialising the train context on them and launching the train function;
* the run's TensorBoard scalar ``train/loss_step``: the wall time at the end of step 1.

The first run also pays for first imports in the driver; later runs show the steady state
(what every sweep trial and every integration test's run pays). Prints one line per run and
writes ``bench/results/train_startup.json``. The dataset: ``--data`` (a prepared dataset), by
default a synthetic one of 320 random 16x16x1 images prepared into a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHASES = {
    "actors": re.compile(r"(\d+) worker actors created in ([\d.]+)s"),
    "context": re.compile(r"Train context initialized on workers in ([\d.]+)s"),
    "launch": re.compile(r"Train function launched on workers in ([\d.]+)s"),
}


def synthetic_dataset(root: Path) -> Path:
    import numpy as np

    from raydiff.data import PrepareOptions, prepare_dataset

    rng = np.random.default_rng(0)
    npz = root / "images.npz"
    np.savez(npz, rng.integers(0, 256, (320, 16, 16), np.uint8), np.arange(320) % 10)
    out = root / "dataset"
    prepare_dataset(
        PrepareOptions(
            source=str(npz),
            out=str(out),
            image_size=16,
            channels=1,
            val_count=32,
            num_workers=1,
            progress=False,
        )
    )
    return out


def controller_times(log: Path) -> dict[str, float]:
    """The worker-group start (wall time) and the phase durations a controller log names."""
    found: dict[str, float] = {}
    for line in log.read_text().splitlines():
        record = json.loads(line) if line.startswith("{") else {}
        message = record.get("message", "")
        if "Attempting to start training worker group" in message and "start" not in found:
            stamp = datetime.strptime(record["asctime"], "%Y-%m-%d %H:%M:%S,%f")
            found["start"] = stamp.timestamp()
        for name, pattern in PHASES.items():
            match = pattern.search(message)
            if match and name not in found:
                found[name] = float(match.groups()[-1])
    return found


def first_step_time(run_dir: Path) -> float:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return min(e.wall_time for e in events.Scalars("train/loss_step") if e.step == 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--data", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["PYTHONPATH"] = str(REPO)  # the workers import raydiff from this checkout

    import ray

    from raydiff.config import ExperimentConfig, apply_overrides
    from raydiff.orchestrate.ray_session import start_local_ray
    from raydiff.orchestrate.training_job import run_training_job

    tmp = Path(tempfile.mkdtemp(prefix="raydiff-startup-"))
    data = args.data or synthetic_dataset(tmp)
    context = start_local_ray(num_cpus=4, log_to_driver=False, logging_level=logging.WARNING)
    ray.data.DataContext.get_current().enable_progress_bars = False
    logs = Path(context.address_info["session_dir"]) / "logs" / "train"
    overrides = [
        "model.image_size=16",
        "model.in_channels=1",
        "model.num_channels=32",
        "model.channel_mult=1,2",
        "model.num_res_blocks=1",
        "model.attention_resolutions=8",
        "diffusion.diffusion_steps=100",
        "train.batch_size=8",
        "train.max_steps=2",
        "train.eval_num_images=8",
        "train.eval_timesteps=2",
        "train.sample_count=4",
        "train.sample_steps=2",
        f"scaling.num_workers={args.workers}",
        "scaling.cpus_per_worker=0.5",
        f"data.data_dir={data}",
    ]
    rows = []
    for index in range(args.runs):
        before = set(logs.glob("ray-train-sys-controller-*.log")) if logs.is_dir() else set()
        run_dir = tmp / f"run{index}"
        called = time.time()
        run_training_job(apply_overrides(ExperimentConfig(), overrides), output_dir=run_dir)
        returned = time.time()
        (log,) = set(logs.glob("ray-train-sys-controller-*.log")) - before
        phases = controller_times(log)
        step1 = first_step_time(run_dir)
        row = {
            "run": index,
            "to_worker_group_start_s": phases["start"] - called,
            "worker_actors_s": phases["actors"],
            "train_context_s": phases["context"],
            "launch_s": phases["launch"],
            "to_step1_s": step1 - called,
            "train_fn_to_step1_s": step1
            - phases["start"]
            - phases["actors"]
            - phases["context"]
            - phases["launch"],
            "step1_to_return_s": returned - step1,
            "total_s": returned - called,
        }
        rows.append(row)
        print(
            f"run {index}: call -> controller starts the worker group "
            f"{row['to_worker_group_start_s']:.1f} s | worker actors {row['worker_actors_s']:.1f} s "
            f"| train context {row['train_context_s']:.1f} s | launch {row['launch_s']:.1f} s | "
            f"train fn -> step 1 {row['train_fn_to_step1_s']:.1f} s | call -> step 1 "
            f"{row['to_step1_s']:.1f} s | step 1 -> return {row['step1_to_return_s']:.1f} s | "
            f"total {row['total_s']:.1f} s",
            flush=True,
        )
    out = REPO / "bench" / "results" / "train_startup.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"workers": args.workers, "runs": rows}, indent=2))
    print(f"wrote {out}")
    ray.shutdown()


if __name__ == "__main__":
    main()
