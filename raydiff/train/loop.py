"""The one training loop: every Ray Train worker, ``--single-process`` and sweep trials run it.

``run_loop(config, runtime=..., output_dir=...)`` builds the trainer, continues from the
runtime's checkpoint if there is one, then steps until ``train.max_steps``: metrics every
``log_interval`` steps, validation bits/dim every ``eval_interval``, EMA sample grids every
``sample_interval``, a checkpoint every ``save_interval``, and all of them at the last step.
Where it runs (rank, data, collectives, how checkpoints are stored) is the
:class:`raydiff.train.runtime.Runtime`'s business. No Ray here.

Files under ``output_dir`` (the main rank writes them)::

    checkpoint_NNNNNN/               complete checkpoints (raydiff.train.checkpoint)
    samples/samples_NNNNNN.png       EMA sample grids (DDIM)
    tensorboard/                     TensorBoard event files (scalars, sample grids, histograms)
    config.json                      the resolved config

``output_dir`` may be a URI (``raydiff.storage.RemotePath``): the main rank then writes these
files into a local staging folder and uploads each one after writing it (TensorBoard's events at
every checkpoint and at most every ``EVENTS_UPLOAD_INTERVAL_S`` in between; what a failed
attempt logged after its last checkpoint is dropped on resume anyway, see ``purge_step``).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from raydiff.config import ExperimentConfig, to_dict
from raydiff.seeding import derive_seed
from raydiff.storage import MirroredFolder, RemotePath
from raydiff.train.build import build_trainer
from raydiff.train.checkpoint import load_checkpoint
from raydiff.train.runtime import Runtime
from raydiff.train.sample_grid import ema_samples, sampling_diffusion, save_grid
from raydiff.train.trainer import (
    DataPosition,
    MetricAccumulator,
    RanksOutOfSyncError,
    ThroughputWindow,
    format_eta,
    now,
    progress_fields,
)
from raydiff.train.validation import (
    estimate_bpd,
    stratified_timesteps,
    validation_metrics,
    weights_swapped,
)

logger = logging.getLogger(__name__)

VAL_BATCH_SIZE = 64
"""Images per forward pass of the validation estimate (per rank)."""

EVENTS_UPLOAD_INTERVAL_S = 60.0
"""A remote run folder's TensorBoard events are uploaded (whole) at most this often between
checkpoints."""


def run_loop(
    config: ExperimentConfig, *, runtime: Runtime, output_dir: Path | RemotePath
) -> dict[str, Any]:
    """Train until ``config.train.max_steps``; returns the last reported metrics (main rank)."""
    train = config.train
    global_batch = train.batch_size
    with runtime.resume_checkpoint() as resume:
        state = load_checkpoint(resume) if resume is not None else None
    trainer = build_trainer(config, runtime=runtime, fresh=state is None)
    raw_model = trainer.raw_model
    position = DataPosition()
    if state is not None:
        trainer.restore(state)
        position = DataPosition.from_state(state["trainer"], global_batch=global_batch)
        logger.info("resumed from %s at step %d", resume, trainer.step)
        del state
    if trainer.step >= train.max_steps:
        logger.warning(
            "the run is already at step %d >= train.max_steps=%d: nothing to train (raise "
            "--max-steps to continue it, or choose another --output for a new run)",
            trainer.step,
            train.max_steps,
        )
        return {"step": trainer.step}
    if position.batches:
        logger.info(
            "continuing epoch %d after its first %d batches", position.epoch, position.batches
        )

    diffusion = trainer.diffusion
    batches = runtime.train_batches(batch_size=trainer.local_batch_size, position=position)
    writer = files = None
    if runtime.is_main:
        # Written in place (a local run folder), or staged locally and uploaded (a URI).
        files = MirroredFolder(output_dir)
        files.local.mkdir(parents=True, exist_ok=True)
        (files.local / "config.json").write_text(json.dumps(to_dict(config), indent=2))
        files.publish("config.json")
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(
            str(files.local / "tensorboard"),
            # Events a failed attempt logged past the step this one starts from (its checkpoint,
            # or 0 for a run restarted before the first one) are dropped: without this
            # TensorBoard shows two curves over the same steps.
            purge_step=trainer.step + 1,
        )
    preview = sampling_diffusion(diffusion, steps=train.sample_steps)
    eval_t = stratified_timesteps(
        diffusion.num_timesteps,
        train.eval_timesteps,
        seed=derive_seed(train.seed, "val-timesteps"),
    )
    image_shape = (config.model.in_channels, config.model.image_size, config.model.image_size)
    num_classes = config.model.num_classes if config.model.class_cond else None
    loss_aware = train.schedule_sampler != "uniform"
    metrics = MetricAccumulator(num_timesteps=diffusion.num_timesteps)
    window = ThroughputWindow(global_batch)
    # Per-step losses, written at log steps with the wall time of their step (no host sync).
    step_losses: list[tuple[int, torch.Tensor, float]] = []
    run_start, start_step = now(), trainer.step
    last_report: dict[str, Any] = {}

    def evaluate() -> dict[str, float]:
        """Validation bits/dim of the EMA weights: every rank its share, summed over ranks."""
        per_rank = max(1, train.eval_num_images // runtime.world_size)
        val = runtime.val_batches(num_images=per_rank, batch_size=min(per_rank, VAL_BATCH_SIZE))
        with weights_swapped(raw_model, trainer.eval_weights()):
            totals = estimate_bpd(
                diffusion=diffusion,
                model=raw_model,
                batches=val,
                timesteps=eval_t,
                seed=derive_seed(train.seed, "val-noise", runtime.rank),
            )
        totals = runtime.all_reduce_sum(totals)
        return validation_metrics(totals) if float(totals["count"]) > 0 else {}

    def sample_grid() -> None:
        """Main rank only, no collective: any step may draw one."""
        assert writer is not None and files is not None
        images = ema_samples(
            model=raw_model,
            ema_state=trainer.eval_weights(),
            diffusion=preview,
            num_samples=train.sample_count,
            image_shape=image_shape,
            seed=derive_seed(train.seed, "sample-grid"),
            num_classes=num_classes,
        )
        path = save_grid(images, files.local / "samples" / f"samples_{trainer.step:06d}.png")
        writer.add_images("samples/ema", (images.clamp(-1, 1) + 1) / 2, trainer.step)
        logger.info("wrote sample grid %s", files.publish(path))

    def publish_events(*, now: bool) -> None:
        """A remote run folder's TensorBoard events so far (``now``: whatever the interval)."""
        assert writer is not None and files is not None
        if files.is_remote:
            writer.flush()
            files.publish("tensorboard", min_interval_s=0 if now else EVENTS_UPLOAD_INTERVAL_S)

    def rank_fingerprints() -> list[list[float]]:
        """Every rank's :meth:`Trainer.weight_fingerprint` (a collective: all ranks call it);
        ranks that differ stop the run, which then restarts from its last checkpoint."""
        table = torch.zeros(runtime.world_size, 2, dtype=torch.float64)
        table[runtime.rank] = trainer.weight_fingerprint()
        table = runtime.all_reduce_sum({"weights": table})["weights"].reshape(-1, 2)
        if not torch.equal(table, table[:1].expand_as(table)):
            raise RanksOutOfSyncError(
                f"at step {trainer.step} the data-parallel ranks hold different weights "
                f"(sum, sum of squares per rank: {table.tolist()}); the run restarts from its "
                "last checkpoint, whose weights every rank loads"
            )
        return table.tolist()

    def checkpoint_files(fingerprints: list[list[float]]) -> dict[str, Any]:
        """What a checkpoint holds (main rank; a loss-history actor is read here)."""
        trainer_state = trainer.state_dict()
        trainer_state.update(position.state(global_batch=global_batch))
        # Evidence that every rank held these weights: one fingerprint per rank, all equal.
        trainer_state["rank_weight_fingerprints"] = fingerprints
        return {
            "model_state": raw_model.state_dict(),
            "ema_states": {r: trainer.ema.state_dict_for(r, raw_model) for r in trainer.ema.rates},
            "trainer_state": trainer_state,
            "config": to_dict(config),
        }

    raw_model.train()
    while trainer.step < train.max_steps:
        window.begin()
        epoch, batch = next(batches)
        window.data_ready()
        position.advance(epoch)
        cond = {"y": batch["y"]} if "y" in batch else {}
        result = trainer.train_step(batch["x"], cond)
        window.end()
        metrics.add_step(result)
        step = trainer.step
        last = step == train.max_steps
        if writer is not None:
            # The objective this step optimised: importance-weighted, as the logged means.
            step_loss = (result.losses["loss"] * result.weights).mean()
            step_losses.append((step, step_loss, time.time()))
        is_log = step % train.log_interval == 0 or last
        is_save = step % train.save_interval == 0 or last
        is_eval = (train.eval_interval and step % train.eval_interval == 0) or last
        is_sample = (train.sample_interval and step % train.sample_interval == 0) or last
        if is_sample and runtime.is_main:
            sample_grid()
        if not (is_log or is_save or is_eval):
            continue
        report: dict[str, Any] = {"step": step}
        if is_log or is_save:
            # Loss terms over every rank's samples (grad_norm is identical on all ranks).
            report.update(metrics.flush(reduce=runtime.all_reduce_sum))
            report.update(
                epoch=epoch,
                lr=result.lr,
                loss_scale=result.loss_scale,
                skipped_steps=trainer.skipped_steps,
                **window.read(),
            )
        if is_eval:
            report.update(evaluate())
        if writer is not None:
            for logged_step, loss, wall_time in step_losses:
                writer.add_scalar("train/loss_step", float(loss), logged_step, walltime=wall_time)
            step_losses.clear()
            for key, value in report.items():
                if key != "step":
                    writer.add_scalar(f"train/{key}", value, step)
            if loss_aware:
                writer.add_histogram(
                    "sampler/weights", torch.from_numpy(trainer.sampler.weights()), step
                )
            eta = (now() - run_start) / max(step - start_step, 1) * (train.max_steps - step)
            logger.info(
                "step %d/%d  %s  eta %s",
                step,
                train.max_steps,
                progress_fields(report),
                format_eta(eta),
            )
            publish_events(now=is_save)
        checkpoint = functools.partial(checkpoint_files, rank_fingerprints()) if is_save else None
        runtime.report(report, step=step, checkpoint=checkpoint)
        last_report.update(report)
    if writer is not None and files is not None:
        writer.close()
        publish_events(now=True)
        files.close()
    return last_report
