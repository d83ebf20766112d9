"""A resumed Ray run continues exactly where the uninterrupted run of the same config stood.

One Ray Train worker, the real Ray Data pipeline: a run started from the uninterrupted run's
checkpoint of step 40 (epoch 1, batch 4 of 36; ``--resume``, into a folder of its own) reaches the
same per-step losses, final weights and post-hoc EMA snapshots as the run that never stopped. That takes the weights, EMA, optimiser and sampler from the
checkpoint, the data position (epoch, batches already seen, that epoch's block order) from it
too, the loss-aware sampler's history (its actor) and refresh schedule, and every random draw of
a step from (seed, rank, step).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tiny_model import tiny_model

from raydiff.config import ExperimentConfig, apply_overrides

BATCH = 8  # 288 train rows: 36 batches per epoch on one worker


def config(data_dir: Path, max_steps: int) -> ExperimentConfig:
    return apply_overrides(
        ExperimentConfig(),
        [
            *tiny_model(),
            "model.dropout=0.1",  # dropout draws too: its stream must continue as well
            "diffusion.diffusion_steps=20",  # 200 losses warm the loss-aware sampler up
            "diffusion.noise_schedule=cosine",
            "optim.ema_rate=0.9",
            "optim.posthoc_ema_stds=0.05,0.10",  # post-hoc EMA profiles continue exactly too
            "optim.posthoc_ema_interval=4",
            f"train.batch_size={BATCH}",
            f"train.max_steps={max_steps}",
            "train.log_interval=8",
            "train.save_interval=40",
            "train.eval_num_images=8",
            "train.eval_timesteps=2",
            "train.sample_count=4",
            "train.sample_steps=2",
            "train.schedule_sampler=loss-second-moment",
            "scaling.sampler_refresh_interval=3",  # the resume step 40 is not a multiple
            "scaling.num_workers=1",
            "scaling.cpus_per_worker=0.5",
            f"data.data_dir={data_dir}",
            "data.val_split=",  # validation is not what this checks
        ],
    )


def step_losses(run: Path) -> dict[int, float]:
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {e.step: e.value for e in events.Scalars("train/loss_step")}


def test_a_resumed_one_worker_run_continues_the_data_order_and_the_losses(
    ray_cluster, tiny_dataset, tmp_path
):
    from raydiff.orchestrate.training_job import run_training_job

    whole, parts = tmp_path / "whole", tmp_path / "parts"
    run_training_job(config(tiny_dataset.path, 48), output_dir=whole)  # checkpoints 40 and 48
    result = run_training_job(
        config(tiny_dataset.path, 48), output_dir=parts, resume=whole / "checkpoint_000040"
    )
    assert result["step"] == 48 and result["epoch"] == 1
    expected, resumed = step_losses(whole), step_losses(parts)
    assert sorted(resumed) == list(range(41, 49))  # this run trained the last 8 steps only
    assert [resumed[s] for s in range(41, 49)] == [expected[s] for s in range(41, 49)]
    weights = torch.load(parts / "checkpoint_000048" / "trainer.pt", weights_only=True)
    weights = weights["sampler"]["weights"]
    assert weights.max() > 1.1 * weights.min()  # the sampler is warm: not a uniform-only check
    for name in ("model.pt", "ema_0.9.pt"):
        a = torch.load(whole / "checkpoint_000048" / name, weights_only=True)
        b = torch.load(parts / "checkpoint_000048" / name, weights_only=True)
        assert all(torch.equal(a[k], b[k]) for k in a), name
    # The post-hoc EMA snapshots after the resume are the uninterrupted run's, bit for bit.
    assert sorted(p.name for p in (parts / "posthoc_ema").iterdir()) == [
        "snapshot_0000044.pt",
        "snapshot_0000048.pt",
    ]
    for name in ("snapshot_0000044.pt", "snapshot_0000048.pt"):
        a = torch.load(whole / "posthoc_ema" / name, weights_only=True)["profiles"]
        b = torch.load(parts / "posthoc_ema" / name, weights_only=True)["profiles"]
        assert a.keys() == b.keys() == {"0.050", "0.100"}
        assert all(torch.equal(a[s][k], b[s][k]) for s in a for k in a[s]), name
