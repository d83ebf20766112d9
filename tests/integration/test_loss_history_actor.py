"""The loss-history actor on the shared local Ray cluster: two ranks reach the same non-uniform
weights at the same steps, and a killed actor comes back (Ray's restart) with the history of
the run's newest complete checkpoint."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch

if TYPE_CHECKING:
    from ray.actor import ActorHandle

    from raydiff.orchestrate.loss_history_actor import ActorSyncedSampler

NUM_TIMESTEPS = 20
HISTORY_PER_TERM = 10  # history_sampler's losses per t (IDDPM's default)


def _loss_of(t: np.ndarray) -> np.ndarray:
    """A synthetic per-t loss: larger t, larger loss, so the weights end up ~ (0.1 + t)."""
    return 0.1 + t.astype(np.float64)


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    """A run folder: it names the run's actor."""
    from raydiff.orchestrate.loss_history_actor import kill_actor

    folder = tmp_path / f"test-sampler-{uuid.uuid4().hex[:10]}"
    yield folder
    kill_actor(folder)  # detached: it would outlive the test session otherwise


def test_two_ranks_reach_the_same_non_uniform_weights_at_the_same_steps(
    ray_cluster: None, tmp_path: Path, run_dir: Path
) -> None:
    import ray.train
    from ray.train.torch import TorchTrainer

    from raydiff.orchestrate.loss_history_actor import get_or_create_actor

    num_steps, refresh_interval, batch = 40, 2, 16
    out = tmp_path / "weights"
    out.mkdir()
    # The driver creates the actor first, as the training driver does.
    get_or_create_actor(run_dir, num_timesteps=NUM_TIMESTEPS)

    def loop(config: dict) -> None:
        import numpy as np
        import ray.train
        import torch.distributed as dist

        from raydiff.orchestrate.loss_history_actor import ActorSyncedSampler, _StepCount

        rank = ray.train.get_context().get_world_rank()
        sampler = ActorSyncedSampler(
            _StepCount(config["num_timesteps"]),
            run_dir=config["run_dir"],
            rank=rank,
            seed=1000 + rank,
            refresh_interval=config["refresh_interval"],
            broadcast=lambda tensor: dist.broadcast(tensor, src=0),
        )
        sampler.reset_history()  # a fresh run (rank 0 empties the actor)
        dist.barrier()  # no rank records before the reset (DDP's all-reduce orders it in training)
        weights, ts, importance = [], [], []
        for _ in range(config["num_steps"]):
            weights.append(sampler.weights().copy())  # what this step samples from
            t, w = sampler.sample(config["batch"], "cpu")
            ts.append(t.numpy())
            importance.append(w.numpy())
            loss = 0.1 + t.double()  # the same per-t loss as _loss_of
            sampler.record_losses(t, loss)  # fire-and-forget; a refresh every 2 steps
        np.savez(
            f"{config['out']}/rank{rank}.npz",
            weights=np.stack(weights),
            ts=np.stack(ts),
            importance=np.stack(importance),
        )

    started = time.time()
    TorchTrainer(
        loop,
        train_loop_config={
            "num_timesteps": NUM_TIMESTEPS,
            "refresh_interval": refresh_interval,
            "num_steps": num_steps,
            "batch": batch,
            "out": str(out),
            "run_dir": str(run_dir),
        },
        scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        run_config=ray.train.RunConfig(name=run_dir.name, storage_path=str(tmp_path / "storage")),
    ).fit()
    print(f"fit: {time.time() - started:.1f}s")
    ranks = [np.load(out / f"rank{rank}.npz") for rank in (0, 1)]
    weights = ranks[0]["weights"]  # [steps, T]

    # Both ranks sampled from the same weights at every step (rank 0's broadcast).
    np.testing.assert_array_equal(ranks[1]["weights"], weights)
    # Uniform until every t holds HISTORY_PER_TERM losses, non-uniform at the end: p_t ~ loss_t.
    assert (weights[0] == 1).all()
    final = weights[-1] / weights[-1].sum()
    expected = _loss_of(np.arange(NUM_TIMESTEPS)) / _loss_of(np.arange(NUM_TIMESTEPS)).sum()
    expected = expected * (1 - 0.001) + 0.001 / NUM_TIMESTEPS  # IDDPM's 0.1% uniform mix
    np.testing.assert_allclose(final, expected, rtol=1e-9)
    changes = [s for s in range(1, num_steps) if not np.array_equal(weights[s], weights[s - 1])]
    assert changes, "the weights never left uniform"
    assert all(s % refresh_interval == 0 for s in changes), changes  # only at refresh steps

    # Sampled t follow those weights: each t's importance weight is 1 / (T p_t) under the step's
    # weights, and t's mean over the non-uniform steps matches the weights' mean.
    for rank in ranks:
        p = rank["weights"] / rank["weights"].sum(axis=1, keepdims=True)  # [steps, T]
        p_of_t = np.take_along_axis(p, rank["ts"], axis=1)  # [steps, batch]
        np.testing.assert_allclose(rank["importance"], 1 / (NUM_TIMESTEPS * p_of_t), rtol=1e-5)
    skewed = [s for s in range(num_steps) if not (weights[s] == weights[s][0]).all()]
    assert len(skewed) >= 10, f"only {len(skewed)} steps with non-uniform weights"
    t_skewed = np.concatenate([rank["ts"][skewed] for rank in ranks]).astype(np.float64)
    p = weights[skewed] / weights[skewed].sum(axis=1, keepdims=True)
    mean_expected = float((p @ np.arange(NUM_TIMESTEPS)).mean())  # ~13 (uniform: 9.5)
    spread = float(np.arange(NUM_TIMESTEPS).std()) / np.sqrt(t_skewed.size)
    assert abs(t_skewed.mean() - mean_expected) < 4 * spread, (t_skewed.mean(), mean_expected)
    assert t_skewed.mean() > 9.5 + 4 * spread  # not uniform


def _save_sampler_checkpoint(root: Path, step: int, sampler_state: dict) -> Path:
    """A real checkpoint folder (files.json last) whose trainer.pt holds ``sampler_state``."""
    from raydiff.train.checkpoint import save_checkpoint

    return save_checkpoint(
        root,
        step,
        model_state={"w": torch.zeros(1)},
        ema_states={},
        trainer_state={"step": step, "sampler": sampler_state},
        config={},
    )


def _record(sampler: ActorSyncedSampler, ts: list[int]) -> None:
    t = torch.tensor(ts)
    sampler.record_losses(t, torch.from_numpy(_loss_of(t.numpy())))


def _history(actor: ActorHandle) -> dict[str, torch.Tensor]:
    import ray

    return ray.get(actor.state_dict.remote())


def _kill_and_wait_for_exit(actor: ActorHandle) -> int:
    """Kill the actor's process the way a crash would (Ray restarts it) and return once the old
    process is gone, so that every later call can only reach the restarted one."""
    import ray

    pid = ray.get(actor.info.remote())["pid"]
    ray.kill(actor, no_restart=False)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return pid
        if state in ("Z", "X"):  # exited, not yet reaped by the raylet
            return pid
        time.sleep(0.05)
    raise AssertionError(f"the actor's process {pid} did not exit after ray.kill")


def test_a_killed_actor_comes_back_with_the_newest_checkpoints_history(
    ray_cluster: None, tmp_path: Path, run_dir: Path
) -> None:
    import ray

    from raydiff.orchestrate.loss_history_actor import (
        ActorSyncedSampler,
        _StepCount,
        actor_name,
        get_or_create_actor,
        kill_actor,
    )

    # A --resume run: its folder has no checkpoint yet, the history comes from another run's.
    source = _save_sampler_checkpoint(
        tmp_path / "other-run",
        3,
        {
            "loss_history": torch.full((NUM_TIMESTEPS, HISTORY_PER_TERM), 2.0),
            "loss_counts": torch.full((NUM_TIMESTEPS,), 3),
        },
    )
    actor = get_or_create_actor(run_dir, num_timesteps=NUM_TIMESTEPS, resume_checkpoint=source)
    sampler = ActorSyncedSampler(
        _StepCount(NUM_TIMESTEPS),
        run_dir=run_dir,
        rank=0,
        seed=0,
        refresh_interval=1000,
        resume_checkpoint=source,
    )
    first = ray.get(actor.info.remote())
    assert first["restored_from"] == str(source)
    sampler.reset_history()  # as rank 0 does when the run starts from scratch
    assert ray.get(actor.info.remote())["num_recorded"] == 0

    # Before run_dir has a checkpoint, a restart falls back to resume_checkpoint.
    _record(sampler, [0, 1, 2])
    sampler.wait_for_records()
    assert _kill_and_wait_for_exit(actor) == first["pid"]
    back = ray.get(actor.info.remote())  # the same handle: Ray restarted the actor behind it
    assert back["pid"] != first["pid"] and back["restored_from"] == str(source)
    assert int(_history(actor)["loss_counts"].sum()) == NUM_TIMESTEPS * 3

    # Checkpoint at step 8 with what the run recorded, then record more that no checkpoint holds.
    _record(sampler, list(range(NUM_TIMESTEPS)) * 2)
    saved = sampler.state_dict()  # rank 0's checkpoint state: the actor's history + RNG + weights
    assert int(saved["loss_counts"].sum()) == NUM_TIMESTEPS * 5
    checkpoint = _save_sampler_checkpoint(run_dir, 8, saved)
    # A newer, partial copy (no files.json: Ray was still copying it) must be skipped.
    partial = run_dir / "checkpoint_000012"
    partial.mkdir()
    (partial / "trainer.pt").write_bytes(b"partial")
    _record(sampler, [5] * 7)
    sampler.wait_for_records()
    assert int(_history(actor)["loss_counts"].sum()) > int(saved["loss_counts"].sum())

    started = time.time()
    _kill_and_wait_for_exit(actor)
    # Sent while the actor is dead or restarting: fire-and-forget, retried on the new process.
    _record(sampler, [7, 7])
    sampler.wait_for_records()  # blocks until the restarted actor has it
    restart_s = time.time() - started
    info = ray.get(actor.info.remote())
    assert info["pid"] not in (first["pid"], back["pid"])
    assert info["restored_from"] == str(checkpoint)
    history = _history(actor)
    # Exactly the checkpoint's history plus the two losses sent during the restart: the 7
    # losses recorded after the checkpoint died with the old process.
    expected_counts = saved["loss_counts"].clone()
    expected_counts[7] = min(HISTORY_PER_TERM, int(expected_counts[7]) + 2)
    torch.testing.assert_close(history["loss_counts"], expected_counts)
    torch.testing.assert_close(history["loss_history"][:, :5], saved["loss_history"][:, :5])
    assert history["loss_history"][7, 5:7].tolist() == pytest.approx([7.1, 7.1])
    print(f"restart to first answer: {restart_s:.1f}s")

    # kill_actor ends it for good (no restart): the name is free again.
    kill_actor(run_dir)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(actor.info.remote())
    assert actor_name(run_dir) not in {
        a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
    }
