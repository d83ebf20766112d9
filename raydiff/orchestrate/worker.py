"""``train_loop_per_worker``: wires the Ray-free ``Trainer`` to Ray Train on every rank.

Everything here is glue: the model is wrapped by ``prepare_model`` (DDP when world size > 1),
batches come from the rank's Ray Data shard, metrics and checkpoints go through
``ray.train.report`` (every rank reports at the same steps; only rank 0 attaches the checkpoint),
TensorBoard is written by rank 0. Resume works on any number of workers: every rank loads the
same checkpoint files itself, no collective is involved.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist

from raydiff.config import ExperimentConfig, from_dict, to_dict
from raydiff.core.factory import create_gaussian_diffusion, create_model
from raydiff.core.timestep_sampler import ScheduleSampler, UniformSampler
from raydiff.data.pipeline import iterate_batches
from raydiff.orchestrate.sampler_actor import ActorSyncedSampler
from raydiff.train.checkpoint import load_checkpoint, load_model_weights, write_checkpoint_files
from raydiff.train.ema import EMA
from raydiff.train.loop import ema_samples, sampling_diffusion, seed_everything
from raydiff.train.sample_grid import save_grid
from raydiff.train.trainer import (
    DataPosition,
    MetricAccumulator,
    ThroughputWindow,
    Trainer,
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


def _configure_logging(rank: int) -> None:
    """raydiff's loggers rank-prefixed, INFO on rank 0 and WARNING elsewhere; Ray's untouched."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(f"%(asctime)s [rank {rank}] %(name)s: %(message)s"))
    package = logging.getLogger("raydiff")
    package.handlers[:] = [handler]
    package.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    package.propagate = False
    # Ray Train logs every report at INFO from every rank (its logger is named after its file);
    # keep its warnings only.
    try:
        import ray.train.v2._internal.execution.context as train_context

        logging.getLogger(train_context.__file__).setLevel(logging.WARNING)
    except ImportError:  # another Ray version: its logs stay as they are
        pass
    logging.getLogger("ray.train").setLevel(logging.WARNING)


def _broadcast_from_rank0(tensor: torch.Tensor) -> None:
    dist.broadcast(tensor, src=0)


def _all_reduce_sum(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    # One collective for everything: flatten, reduce, split back.
    keys = sorted(values)
    flat = [values[k].double().reshape(-1) for k in keys]
    packed = torch.cat(flat)
    dist.all_reduce(packed)
    return dict(zip(keys, torch.split(packed, [f.numel() for f in flat]), strict=True))


def train_loop_per_worker(loop_config: dict[str, Any]) -> dict[str, Any]:
    """The function every Ray Train worker runs.

    ``loop_config``: config, actor_key (names the run's sampler actor), output_dir, resume.
    """
    config = from_dict(ExperimentConfig, loop_config["config"])
    actor_key: str = loop_config["actor_key"]
    output_dir = Path(loop_config["output_dir"])
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    _configure_logging(rank)
    # Different dropout / noise streams per rank; DDP makes the initial weights identical.
    seed_everything(config.train.seed + 1000 * rank)
    device = ray.train.torch.get_device()

    model = create_model(config.model, learn_sigma=config.diffusion.learn_sigma)
    # DDP when world size > 1 (the UNet has no buffers, so DDP's buffer syncing is moot).
    wrapped = ray.train.torch.prepare_model(model)
    raw_model = wrapped.module if hasattr(wrapped, "module") else wrapped
    diffusion = create_gaussian_diffusion(config.diffusion)
    sampler: ScheduleSampler
    if config.train.schedule_sampler == "loss-second-moment":
        sampler = ActorSyncedSampler(
            diffusion,
            run_name=actor_key,
            rank=rank,
            seed=config.train.seed * 1000 + rank,
            refresh_interval=config.scaling.sampler_refresh_interval,
            broadcast=_broadcast_from_rank0 if world_size > 1 else None,
        )
    else:
        sampler = UniformSampler(diffusion, seed=config.train.seed * 1000 + rank)
    local_batch = config.train.per_worker_batch(world_size)
    trainer = Trainer(
        model=wrapped,
        raw_model=raw_model,
        diffusion=diffusion,
        sampler=sampler,
        optim=config.optim,
        train=config.train,
        local_batch_size=local_batch,
        device=device,
    )

    position = DataPosition()
    global_batch = config.train.batch_size
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = load_checkpoint(Path(directory))
        _restore(trainer, state, rank)
        position = DataPosition.from_state(state["trainer"], global_batch=global_batch)
        logger.info("resumed from Ray Train's latest checkpoint at step %d", trainer.step)
    elif loop_config.get("resume"):
        state = load_checkpoint(Path(loop_config["resume"]))
        _restore(trainer, state, rank)
        position = DataPosition.from_state(state["trainer"], global_batch=global_batch)
        logger.info("resumed from %s at step %d", loop_config["resume"], trainer.step)
    else:
        if config.train.init_checkpoint:
            load_model_weights(raw_model, config.train.init_checkpoint)
            trainer.ema = EMA(raw_model, config.optim.ema_rates())
            logger.info("initialised the weights from %s", config.train.init_checkpoint)
        if isinstance(sampler, ActorSyncedSampler):
            # The actor outlives a worker group that failed before its first checkpoint.
            sampler.reset_history()

    # Continue inside the resumed epoch: every rank skips the batches the run already trained
    # on (per-rank batches per epoch do not depend on the worker count: rows / global batch).
    if position.batches:
        logger.info(
            "continuing epoch %d after its first %d batches", position.epoch, position.batches
        )
    batches = iterate_batches(
        ray.train.get_dataset_shard("train"),
        batch_size=local_batch,
        config=config.data,
        epoch_start=position.epoch,
        rank=rank,
        skip_batches=position.batches,
    )
    writer = None
    if rank == 0:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(
            str(output_dir / "tensorboard"),
            # Events a failed attempt logged past the step this one starts from (its checkpoint,
            # or 0 for a group restarted before the first one) are dropped: without this
            # TensorBoard shows two curves over the same steps.
            purge_step=trainer.step + 1,
        )
    preview = sampling_diffusion(diffusion, steps=config.train.sample_steps)
    eval_t = stratified_timesteps(
        diffusion.num_timesteps, config.train.eval_timesteps, seed=config.train.seed
    )
    metrics = MetricAccumulator(num_timesteps=diffusion.num_timesteps)
    image_shape = (config.model.in_channels, config.model.image_size, config.model.image_size)
    num_classes = config.model.num_classes if config.model.class_cond else None
    max_steps = config.train.max_steps
    window = ThroughputWindow(config.train.batch_size)
    # Per-step losses, written at log steps with the wall time of their step (no host sync).
    step_losses: list[tuple[int, torch.Tensor, float]] = []
    run_start, start_step = now(), trainer.step
    last_report: dict[str, Any] = {}

    def evaluate() -> dict[str, float]:
        """Validation bits/dim on the EMA weights: every rank its val shard, summed over ranks."""
        shard = ray.train.get_dataset_shard("val") if "val" in loop_config["datasets"] else None
        if shard is None:
            return {}
        per_rank = max(1, config.train.eval_num_images // world_size)
        with weights_swapped(raw_model, trainer.eval_weights()):
            val_batches = _take_images(
                iterate_batches(
                    shard, batch_size=min(per_rank, 64), config=config.data, rank=rank, train=False
                ),
                per_rank,
                device,
            )
            totals = estimate_bpd(
                diffusion=diffusion,
                model=raw_model,
                batches=val_batches,
                timesteps=eval_t,
                seed=config.train.seed + rank,
            )
        return validation_metrics(_all_reduce_sum(totals))

    def sample_grid() -> None:
        if rank != 0:
            return
        weights = trainer.eval_weights()
        images = ema_samples(
            model=raw_model,
            ema_state=weights,
            diffusion=preview,
            num_samples=config.train.sample_count,
            image_shape=image_shape,
            seed=config.train.seed,
            num_classes=num_classes,
        )
        path = save_grid(images, output_dir / "samples" / f"samples_{trainer.step:06d}.png")
        assert writer is not None
        writer.add_images("samples/ema", (images.clamp(-1, 1) + 1) / 2, trainer.step)
        logger.info("wrote sample grid %s", path)

    def report(report_metrics: dict[str, Any], *, with_checkpoint: bool) -> None:
        if not with_checkpoint:
            ray.train.report(report_metrics)
            return
        sampler_state = trainer.state_dict()  # rank 0 fetches the actor's history here
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = None
            if rank == 0:
                sampler_state.update(position.state(global_batch=global_batch))
                sampler_state["torch_rng"] = torch.get_rng_state()
                write_checkpoint_files(
                    Path(tmp),
                    model_state=raw_model.state_dict(),
                    ema_states={
                        r: trainer.ema.state_dict_for(r, raw_model) for r in trainer.ema.rates
                    },
                    trainer_state=sampler_state,
                    config=to_dict(config),
                )
                ckpt = ray.train.Checkpoint.from_directory(tmp)
            # Ray copies the folder into run storage (file by file, not atomically) before
            # report returns; files.json, written last above, tells a complete copy from a
            # partial one (raydiff.train.checkpoint).
            ray.train.report(
                report_metrics,
                checkpoint=ckpt,
                checkpoint_dir_name=f"checkpoint_{trainer.step:06d}",
            )

    if trainer.step >= max_steps:
        logger.info(
            "the run is already at step %d >= train.max_steps=%d: nothing to do (raise "
            "--max-steps to continue it, or choose another --output for a new run)",
            trainer.step,
            max_steps,
        )
        return {"step": trainer.step}
    raw_model.train()
    while trainer.step < max_steps:
        window.begin()
        epoch, batch = next(batches)
        window.data_ready()
        position.advance(epoch)
        cond = {"y": batch["y"]} if "y" in batch else {}
        result = trainer.train_step(batch["x"], cond)
        window.end()
        metrics.add_step(result)
        step = trainer.step
        last = step == max_steps
        if writer is not None:
            # The objective this step optimised: importance-weighted, as the logged means.
            step_loss = (result.losses["loss"] * result.weights).mean()
            step_losses.append((step, step_loss, time.time()))
        is_log = step % config.train.log_interval == 0 or last
        is_save = step % config.train.save_interval == 0 or last
        is_eval = (config.train.eval_interval and step % config.train.eval_interval == 0) or last
        is_sample = (
            config.train.sample_interval and step % config.train.sample_interval == 0
        ) or last
        if is_sample:  # rank 0 only, no collective: any step may draw one
            sample_grid()
        if not (is_log or is_save or is_eval):
            continue
        report_metrics: dict[str, Any] = {}
        if is_save and isinstance(sampler, ActorSyncedSampler):
            # Every rank's losses up to this step are in the history rank 0 checkpoints (the
            # collective in metrics.flush below orders this before rank 0's fetch).
            sampler.wait_for_records()
        if is_log or is_save:
            # Loss terms over every rank's samples (grad_norm is identical on all ranks).
            report_metrics = metrics.flush(reduce=_all_reduce_sum)
            report_metrics.update(
                step=step,
                epoch=epoch,
                lr=result.lr,
                loss_scale=result.loss_scale,
                skipped_steps=trainer.skipped_steps,
                **window.read(),
            )
        if is_eval:
            report_metrics.update(evaluate())
            report_metrics.setdefault("step", step)
        if writer is not None:
            for logged_step, loss, wall_time in step_losses:
                writer.add_scalar("train/loss_step", float(loss), logged_step, walltime=wall_time)
            step_losses.clear()
            for key, value in report_metrics.items():
                if key != "step":
                    writer.add_scalar(f"train/{key}", value, step)
            if isinstance(sampler, ActorSyncedSampler):
                writer.add_histogram("sampler/weights", torch.from_numpy(sampler.weights()), step)
            done = step - start_step
            eta = (now() - run_start) / max(done, 1) * (max_steps - step)
            logger.info(
                "step %d/%d  %s  eta %s",
                step,
                max_steps,
                progress_fields(report_metrics),
                format_eta(eta),
            )
        report(report_metrics, with_checkpoint=is_save)
        last_report.update(report_metrics)
    if writer is not None:
        writer.close()
    return last_report


def _restore(trainer: Trainer, state: dict[str, Any], rank: int) -> None:
    """Load a checkpoint's weights, EMA, optimiser and sampler state into this rank."""
    trainer.restore(state)
    # The checkpoint holds rank 0's random streams; give every rank its own again, as a function
    # of (seed, rank, step) so a resumed run is reproducible on any number of workers. Hashed
    # (SeedSequence), not summed: with seed + rank + step, rank 0 resumed at step 1000 would
    # replay the stream rank 1 started with.
    entropy = [trainer.train_config.seed, rank, trainer.step]
    sampler_seed, torch_seed = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint64)
    trainer.sampler.generator.manual_seed(int(sampler_seed) >> 1)
    torch.manual_seed(int(torch_seed) >> 1)


def _take_images(
    batches: Any, limit: int, device: torch.device
) -> list[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """The first ``limit`` images of a validation epoch.

    The epoch is read to its end (decoding is cheap next to the model): leaving a streaming split
    half-consumed would stall the other ranks' next epoch.
    """
    out, seen = [], 0
    for _, batch in batches:
        if seen >= limit:
            continue
        x = batch["x"][: limit - seen].to(device)
        cond = {"y": batch["y"][: x.shape[0]].to(device)} if "y" in batch else {}
        out.append((x, cond))
        seen += x.shape[0]
    return out
