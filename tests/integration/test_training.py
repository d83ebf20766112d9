"""Distributed training on the shared local Ray cluster: tiny model, tiny real shards.

Covers the training issue's acceptance: a 2-worker run leaves checkpoints, TensorBoard events and
a sample grid; a killed worker is replaced and the run resumes from its last checkpoint with the
sampler history intact; --resume continues a run on a different number of workers.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from raydiff.config import ExperimentConfig, apply_overrides, from_dict, to_dict
from raydiff.train.checkpoint import load_checkpoint, read_progress

GLOBAL_BATCH = 8


def tiny_config(data_dir: Path, **overrides: object) -> dict:
    base = [
        "model.image_size=16",
        "model.in_channels=1",
        "model.num_channels=32",
        "model.channel_mult=1,2",
        "model.num_res_blocks=1",
        "model.attention_resolutions=8",
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
    ]
    base += [f"{k}={v}" for k, v in overrides.items()]
    return to_dict(apply_overrides(ExperimentConfig(), base))


def run(config: dict, output: Path, resume: Path | None = None) -> dict:
    from raydiff.orchestrate.trainer import run_training_job

    return run_training_job(
        from_dict(ExperimentConfig, config), output_dir=output, resume=resume
    )


def recorded_losses(checkpoint: Path) -> int:
    state = load_checkpoint(checkpoint)
    return int(state["trainer"]["sampler"]["loss_counts"].sum())


def test_two_workers_write_checkpoints_events_and_samples(ray_cluster, tiny_dataset, tmp_path):
    out = tmp_path / "run"
    result = run(
        tiny_config(
            tiny_dataset.path,
            **{"train.max_steps": 8, "train.eval_interval": 4, "train.sample_interval": 3},
        ),
        out,
    )
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
    # Every worker's (t, loss) reached the actor: 8 steps x global batch 8.
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

    # A local instance (start_local_ray) runs no preemption watcher: nothing can preempt it.
    actor_classes = {a["ActorClassName"] for a in _actor_table()}
    assert "LossHistoryActor" in actor_classes, actor_classes  # the table does see this run
    assert "PreemptionWatcher" not in actor_classes


def _actor_table() -> list[dict]:
    """Every actor the GCS knows of, dead ones included (the state API needs the dashboard)."""
    import ray

    return list(ray._private.state.actors().values())


def _train_worker_pids() -> list[int]:
    """PIDs of the Ray Train worker processes (their title is ``ray::RayTrainWorker...``)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "RayTrainWorker" in cmdline:
            pids.append(int(proc.name))
    return pids


def test_a_killed_worker_resumes_from_the_last_checkpoint(ray_cluster, tiny_dataset, tmp_path):
    out = tmp_path / "killed"
    max_steps = 40
    config = tiny_config(
        tiny_dataset.path, **{"train.max_steps": max_steps, "scaling.max_failures": 2}
    )
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["result"] = run(config, out)
        except BaseException as error:  # surfaced below
            outcome["error"] = error

    thread = threading.Thread(target=target)
    thread.start()
    deadline = time.time() + 240
    while not (out / "checkpoint_000012").exists() and time.time() < deadline and thread.is_alive():
        time.sleep(0.2)
    pids = _train_worker_pids()
    assert pids, "no Ray Train worker process found to kill"
    os.kill(pids[-1], signal.SIGKILL)
    thread.join(timeout=400)
    assert not thread.is_alive(), "the run did not finish after the worker was killed"
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"]["step"] == max_steps
    final = out / f"checkpoint_{max_steps:06d}"
    assert load_checkpoint(final)["trainer"]["step"] == max_steps
    # History restored from the checkpoint, then extended: exactly one entry per trained sample
    # (lost history would count fewer, a stale actor more).
    assert recorded_losses(final) == max_steps * GLOBAL_BATCH


@pytest.mark.parametrize("first,second", [(2, 1), (1, 2)])
def test_resume_on_a_different_number_of_workers(
    ray_cluster, tiny_dataset, tmp_path, first, second
):
    first_out, second_out = tmp_path / f"first{first}", tmp_path / f"second{second}"
    run(
        tiny_config(tiny_dataset.path, **{"train.max_steps": 4, "scaling.num_workers": first}),
        first_out,
    )
    start = load_checkpoint(first_out / "checkpoint_000004")
    result = run(
        tiny_config(tiny_dataset.path, **{"train.max_steps": 8, "scaling.num_workers": second}),
        second_out,
        resume=first_out / "checkpoint_000004",
    )
    assert result["step"] == 8
    names = sorted(p.name for p in second_out.glob("checkpoint_0*"))
    assert names == ["checkpoint_000008"], names  # the step continued from 4, not from 0
    end = load_checkpoint(second_out / "checkpoint_000008")
    assert end["config"]["scaling"]["num_workers"] == second
    assert recorded_losses(second_out / "checkpoint_000008") == 8 * GLOBAL_BATCH
    # The data position continued too: 8 steps into the (36-step) first epoch, not 4.
    assert read_progress(first_out / "checkpoint_000004") == {
        "step": 4,
        "epoch": 0,
        "epoch_samples": 4 * GLOBAL_BATCH,
    }
    assert read_progress(second_out / "checkpoint_000008") == {
        "step": 8,
        "epoch": 0,
        "epoch_samples": 8 * GLOBAL_BATCH,
    }
    # The EMA continued from the checkpoint's average rather than restarting from the weights.
    ema_start = start["ema"][0.9]["out.2.weight"]
    ema_end = end["ema"][0.9]["out.2.weight"]
    model_end = end["model"]["out.2.weight"]
    assert not torch.equal(ema_end, model_end)
    assert not torch.equal(ema_start, ema_end)


def _run_in_thread(config: dict, out: Path) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["result"] = run(config, out)
        except BaseException as error:  # surfaced by the caller
            outcome["error"] = error

    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome


def test_every_rank_follows_a_recreated_sampler_actor(ray_cluster, tiny_dataset, tmp_path):
    """`.remote()` on a dead actor does not raise, so only rank 0 notices the death; the others
    must switch to the recreated actor too, or their losses go nowhere for the rest of the run."""
    import ray

    from raydiff.orchestrate.sampler_actor import ACTOR_NAMESPACE

    out = tmp_path / "actor-killed"
    config = tiny_config(
        tiny_dataset.path, **{"train.max_steps": 24, "scaling.checkpoints_to_keep": 10}
    )
    thread, outcome = _run_in_thread(config, out)
    deadline = time.time() + 240
    while not (out / "checkpoint_000008").exists() and time.time() < deadline and thread.is_alive():
        time.sleep(0.05)
    actors = [
        a
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == ACTOR_NAMESPACE
    ]
    assert len(actors) == 1, actors
    ray.kill(ray.get_actor(actors[0]["name"], namespace=ACTOR_NAMESPACE))
    thread.join(timeout=300)
    assert not thread.is_alive() and "error" not in outcome, outcome.get("error")
    counts = {s: recorded_losses(out / f"checkpoint_{s:06d}") for s in (16, 20, 24)}
    # Losses sent between the kill and the next weights refresh are lost; after that both
    # ranks' 4 steps x global batch 8 reach the new actor between checkpoints.
    assert counts[20] - counts[16] == 4 * GLOBAL_BATCH, counts
    assert counts[24] - counts[20] == 4 * GLOBAL_BATCH, counts


def test_a_fresh_run_starts_with_an_empty_loss_history(ray_cluster, tiny_dataset, tmp_path):
    """The actor is detached: one left by a killed driver (or by a worker group that failed
    before its first checkpoint) must not lend its losses to a run that starts from scratch."""
    import hashlib

    import numpy as np

    from raydiff.orchestrate.sampler_actor import get_or_create_actor

    out = (tmp_path / "fresh").resolve()
    stale = get_or_create_actor(
        f"{out.name}-{hashlib.sha1(str(out).encode()).hexdigest()[:10]}", num_timesteps=500
    )
    import ray

    ray.get(stale.record.remote(np.arange(40), np.ones(40)))  # a failed attempt's losses
    run(tiny_config(tiny_dataset.path, **{"train.max_steps": 4}), out)
    assert recorded_losses(out / "checkpoint_000004") == 4 * GLOBAL_BATCH


def test_a_ray_run_continues_a_single_process_run_in_its_folder(
    ray_cluster, tiny_dataset, tmp_path
):
    """Checkpoints Ray did not write (a --single-process run) are continued, not overwritten
    from step 0, and their sampler state (history, no broadcast weights) loads on every rank."""
    from raydiff.cli import main

    out = tmp_path / "mixed"
    config = tiny_config(tiny_dataset.path, **{"train.max_steps": 4})
    sets = [
        f"--set={section}.{field}={value}"
        for section, fields in config.items()
        if section in ("model", "diffusion", "optim", "train")
        for field, value in fields.items()
        if not isinstance(value, (list, dict))
    ]
    argv = ["train", "--single-process", *sets, "--data", str(tiny_dataset.path)]
    assert main([*argv, "--output", str(out)]) == 0
    assert recorded_losses(out / "checkpoint_000004") == 4 * GLOBAL_BATCH
    result = run(tiny_config(tiny_dataset.path, **{"train.max_steps": 8}), out)
    assert result["step"] == 8
    assert sorted(p.name for p in out.glob("checkpoint_0*")) == [
        "checkpoint_000004",
        "checkpoint_000008",
    ]
    assert recorded_losses(out / "checkpoint_000008") == 8 * GLOBAL_BATCH


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
        "from raydiff.orchestrate.trainer import ensure_ray\n"
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
