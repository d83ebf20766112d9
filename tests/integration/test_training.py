"""Distributed training on the shared local Ray cluster: tiny model, tiny real shards.

Covers the training issue's acceptance: a 2-worker run leaves checkpoints, TensorBoard events and
a sample grid; a Ray run on 2 workers continues a single-process run (1 worker) where it stood.
``--resume`` from a checkpoint into a folder of its own, continuing exactly (weights, EMA, data
position, sampler): test_resume.py. A killed worker or a removed node is the fault suite's
(test_faults.py).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image
from tiny_model import tiny_model

from raydiff.config import ExperimentConfig, apply_overrides, from_dict, to_dict
from raydiff.train.checkpoint import load_checkpoint, read_progress

GLOBAL_BATCH = 8


def tiny_config(data_dir: Path, **overrides: object) -> dict:
    base = [
        *tiny_model(attention="8"),
        "diffusion.diffusion_steps=500",  # 500 t x 10 history slots: no FIFO saturates here
        "diffusion.noise_schedule=cosine",
        "optim.lr=1e-3",
        "optim.ema_rate=0.9,0.5",
        f"train.batch_size={GLOBAL_BATCH}",
        "train.log_interval=2",
        "train.save_interval=4",
        "train.eval_interval=0",
        "train.eval_num_images=8",
        "train.eval_timesteps=2",
        "train.sample_count=4",
        "train.sample_steps=4",
        "train.schedule_sampler=loss-second-moment",
        "scaling.num_workers=2",
        "scaling.cpus_per_worker=0.5",
        "scaling.sampler_refresh_interval=2",
        f"data.data_dir={data_dir}",
        # No validation unless a test asks for it ("data.val_split": "val"): fewer model calls.
        "data.val_split=",
    ]
    base += [f"{k}={v}" for k, v in overrides.items()]
    return to_dict(apply_overrides(ExperimentConfig(), base))


def run(config: dict, output: Path, resume: Path | None = None) -> dict:
    from raydiff.orchestrate.training_job import run_training_job

    return run_training_job(from_dict(ExperimentConfig, config), output_dir=output, resume=resume)


def recorded_losses(checkpoint: Path) -> int:
    state = load_checkpoint(checkpoint)
    return int(state["trainer"]["sampler"]["loss_counts"].sum())


@dataclass(frozen=True)
class TwoWorkerRun:
    out: Path
    result: dict
    process_titles: set[str]  # of this session's Ray processes, seen while the run ran
    metrics: dict[str, float]  # its gauges on the node's Prometheus endpoint, right after it
    panels: dict[str, list] | None  # each dashboard panel's series; None without Prometheus


def two_worker_run_in(out: Path, data_dir: Path, *, prometheus: str | None) -> TwoWorkerRun:
    """The tiny model, 8 steps on 2 workers, validation every 4 steps and a sample grid every 3,
    the loss-aware sampler; tests/integration/conftest.py's ``two_worker_run`` runs it once for
    this module's checks, test_metrics.py's and, read from the Prometheus server at
    ``prometheus`` (when there is one), test_dashboard_prometheus.py's (a run costs ~30 s
    here)."""
    import numpy as np
    import ray

    from raydiff.orchestrate.loss_history_actor import get_or_create_actor

    # The loss-history actor is detached: one left by a killed driver (or by a worker group that
    # failed before its first checkpoint) must not lend its losses to a run that starts afresh
    # (test_two_workers_write_checkpoints_events_and_samples counts the losses).
    stale = get_or_create_actor(out.resolve(), num_timesteps=500)
    ray.get(stale.record.remote(np.arange(40), np.ones(40)))
    started = time.time()
    with _RayProcessTitles() as titles:  # what ran, seen while it ran
        result = run(
            tiny_config(
                data_dir,
                **{
                    "train.max_steps": 8,
                    "train.eval_interval": 4,
                    "train.sample_interval": 3,
                    "data.val_split": "val",
                },
            ),
            out,
        )
    from test_dashboard_prometheus import dashboard_series
    from test_metrics import run_metrics

    metrics = run_metrics(out.name)
    panels = None
    if prometheus is not None:
        panels = dashboard_series(prometheus, out.name, start=started, step=8)
    return TwoWorkerRun(
        out=out, result=result, process_titles=titles.seen, metrics=metrics, panels=panels
    )


def test_two_workers_write_checkpoints_events_and_samples(two_worker_run):
    out, result = two_worker_run.out, two_worker_run.result
    assert result["step"] == 8
    assert result["val_bpd"] > 0 and result["val_mse"] > 0
    assert sorted(p.name for p in out.glob("checkpoint_0*")) == [
        "checkpoint_000004",
        "checkpoint_000008",
    ]
    final = load_checkpoint(out / "checkpoint_000008")
    assert final["trainer"]["step"] == 8
    assert set(final["ema"]) == {0.9, 0.5}
    assert final["config"]["scaling"]["num_workers"] == 2
    # Every worker's (t, loss) reached the actor, and nothing else: 8 steps x global batch 8.
    assert recorded_losses(out / "checkpoint_000008") == 8 * GLOBAL_BATCH
    # Every sample_interval step draws a grid, also between log steps, and the last step does.
    assert sorted(p.name for p in (out / "samples").iterdir()) == [
        "samples_000003.png",
        "samples_000006.png",
        "samples_000008.png",
    ]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    tags = events.Tags()
    assert {"train/loss", "train/loss_q0", "train/grad_norm", "train/val_bpd"} <= set(
        tags["scalars"]
    )
    assert "samples/ema" in tags["images"]
    assert [e.step for e in events.Scalars("train/loss")] == [2, 4, 6, 8]

    seen = " ".join(two_worker_run.process_titles)
    assert "ray::LossHistoryActor" in seen, seen  # the monitor does see this run's actors
    assert "ray::RayTrainWorker" in seen, seen


def _cluster_processes() -> dict[int, str]:
    """{pid: process title} of this test session's Ray processes, i.e. every descendant of this
    process (its private Ray instance's raylet and the workers and actors it started).

    Ray's public listing of actors (``ray.util.state.list_actors``) needs the dashboard, which the
    test cluster runs without (it raises ServerUnavailable), and ``ray.util.list_named_actors``
    only sees named actors; a Ray worker process is titled ``ray::ClassName`` after its actor.
    Other sessions' clusters on this machine are not descendants, so they are never seen.
    """
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(proc.name))
    titles, todo = {}, [os.getpid()]
    while todo:
        for pid in children.get(todo.pop(), []):
            todo.append(pid)
            try:
                titles[pid] = (Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]).decode(
                    errors="replace"
                )
            except OSError:
                continue
    return titles


class _RayProcessTitles:
    """Collects the titles of this session's Ray processes every 0.5 s while the block runs."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            self.seen.update(_cluster_processes().values())

    def __enter__(self) -> _RayProcessTitles:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def tensorboard_starts(run_dir: Path) -> list[int]:
    """The first step of every TensorBoard event file in the run, oldest file first.

    Rank 0 opens one writer per worker-group attempt with ``purge_step`` = the step it starts
    from + 1, which the writer records as a SessionLog START event: an attempt that resumed
    from checkpoint_S starts at S + 1, a fresh one at 1.
    """
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.compat.proto.event_pb2 import SessionLog

    files = sorted((run_dir / "tensorboard").glob("events.out.tfevents.*"), key=os.path.getmtime)
    return [
        next(
            event.step
            for event in EventFileLoader(str(f)).Load()
            if event.HasField("session_log") and event.session_log.status == SessionLog.START
        )
        for f in files
    ]


def test_a_ray_run_continues_a_single_process_run_in_its_folder(
    ray_cluster, tiny_dataset, tmp_path
):
    """Checkpoints Ray did not write (a --single-process run) are continued, not overwritten
    from step 0, and their sampler state (history, no broadcast weights) loads on every rank.
    The model is an upsampler (``train.task=super_res``, 16x16 from 4x4): its Ray path (two
    Ray Train workers, Ray Data shards, the loss-history actor, validation, the preview of
    low-resolution val images beside their upsamplings) runs here too."""
    from raydiff.cli import main

    out = tmp_path / "mixed"
    upsampler = {
        "train.task": "super_res",
        "super_res.small_size": 4,
        "data.val_split": "val",
        "train.sample_count": 3,
    }
    config = tiny_config(tiny_dataset.path, **{"train.max_steps": 4, **upsampler})
    sets = [
        f"--set={section}.{field}={value}"
        for section, fields in config.items()
        if section in ("model", "super_res", "diffusion", "optim", "train")
        for field, value in fields.items()
        if not isinstance(value, (list, dict))
    ]
    argv = ["train", "--single-process", *sets, "--data", str(tiny_dataset.path)]
    assert main([*argv, "--output", str(out)]) == 0
    assert recorded_losses(out / "checkpoint_000004") == 4 * GLOBAL_BATCH
    result = run(tiny_config(tiny_dataset.path, **{"train.max_steps": 8, **upsampler}), out)
    assert result["step"] == 8 and result["val_bpd"] > 0
    assert sorted(p.name for p in out.glob("checkpoint_0*")) == [
        "checkpoint_000004",
        "checkpoint_000008",
    ]
    assert recorded_losses(out / "checkpoint_000008") == 8 * GLOBAL_BATCH
    # On 2 workers now: the data position continued from the single process's too.
    final = load_checkpoint(out / "checkpoint_000008")
    assert final["config"]["scaling"]["num_workers"] == 2
    assert final["config"]["train"]["task"] == "super_res"
    assert final["model"]["input_blocks.0.0.weight"].shape[1] == 2  # image + its low_res
    # The preview: 3 low-resolution val images (enlarged) beside their 3 upsamplings, a pair per
    # half row: 4 columns (2 pairs), 2 rows of 16 pixels and 2 of padding.
    grid = np.asarray(Image.open(out / "samples" / "samples_000008.png"))
    assert grid.shape[:2] == (2 * 18 + 2, 4 * 18 + 2)
    assert read_progress(out / "checkpoint_000008") == {
        "step": 8,
        "epoch": 0,
        "epoch_samples": 8 * GLOBAL_BATCH,
    }


def test_a_driver_does_not_join_another_processs_private_instance(ray_cluster):
    """The test session's cluster is a private ray.init() of this process: a training driver
    in another process must start its own instance (ray.init(address="auto") joined it, and a
    run would die when this process exits): it joins only the cluster it is given (--address
    or RAY_ADDRESS)."""
    import json
    import subprocess
    import sys

    import ray

    ours = ray.get_runtime_context().gcs_address
    code = (
        "import json, ray\n"
        "from raydiff.orchestrate.ray_session import ensure_ray\n"
        "ensure_ray(address=None, num_workers=1, cpus_per_worker=1)\n"
        "print(json.dumps(ray.get_runtime_context().gcs_address))\n"
        "ray.shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=180
    )
    assert out.returncode == 0, out.stderr[-2000:]
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    assert theirs != ours
