"""A single-process training run: the per-worker logic driven by a plain loop.

This is what ``raydiff train --single-process`` runs (debugging, no Ray) and the baseline that the
Ray overhead benchmark compares against. It writes the same files as a Ray run, validation
included when it is given the val split. Output layout under ``output_dir``::

    checkpoint_NNNNNN/               complete checkpoints (see raydiff.train.checkpoint)
    samples/samples_NNNNNN.png       EMA sample grids (DDIM)
    tensorboard/                     TensorBoard event files (all scalars, sample grids)
    config.json                      the resolved config
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raydiff.config import ExperimentConfig, to_dict
from raydiff.core.factory import create_gaussian_diffusion, create_model
from raydiff.core.respace import SpacedDiffusion, space_timesteps
from raydiff.core.timestep_sampler import create_named_schedule_sampler
from raydiff.train.checkpoint import (
    load_checkpoint,
    load_model_weights,
    resume_point,
    save_checkpoint,
)
from raydiff.train.ema import EMA
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

Batches = Iterator[tuple[int, torch.Tensor, dict[str, torch.Tensor]]]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def sampling_diffusion(base: SpacedDiffusion, *, steps: int) -> SpacedDiffusion:
    """A DDIM-spaced copy of the training diffusion for quick preview samples."""
    total = base.original_num_steps
    steps = min(steps, total)
    try:
        use = space_timesteps(total, f"ddim{steps}")
    except ValueError:
        use = space_timesteps(total, str(steps))
    kept = sorted(base.use_timesteps)
    if len(kept) != total:  # already respaced: sample on its own steps
        use = set(kept)
    return SpacedDiffusion(
        use_timesteps=use,
        betas=base.original_betas,
        model_mean_type=base.model_mean_type,
        model_var_type=base.model_var_type,
        loss_type=base.loss_type,
        rescale_timesteps=base.rescale_timesteps,
    )


@torch.no_grad()
def ema_samples(
    *,
    model: torch.nn.Module,
    ema_state: dict[str, torch.Tensor],
    diffusion: SpacedDiffusion,
    num_samples: int,
    image_shape: tuple[int, int, int],
    seed: int,
    num_classes: int | None,
) -> torch.Tensor:
    """DDIM samples from the EMA weights, with a fixed seed so grids are comparable over time."""
    with weights_swapped(model, ema_state):
        g = torch.Generator().manual_seed(seed)
        kwargs = {}
        if num_classes:
            kwargs["y"] = torch.arange(num_samples) % num_classes
        device = next(model.parameters()).device
        return diffusion.ddim_sample_loop(
            model,
            (num_samples, *image_shape),
            model_kwargs={k: v.to(device) for k, v in kwargs.items()},
            generator=g,
            device=device,
        )


def run_training(
    config: ExperimentConfig,
    *,
    batches: Batches,
    output_dir: Path,
    resume: Path | None = None,
    device: torch.device | None = None,
    num_preview_samples: int | None = None,
    preview_steps: int | None = None,
    val_data: tuple[torch.Tensor, torch.Tensor | None] | None = None,
) -> dict[str, Any]:
    """Train in this process until ``config.train.max_steps``; returns the final metrics.

    Resumes from ``resume`` or else from the newest checkpoint under ``output_dir``.
    ``val_data`` (images in [-1, 1] ``[N, C, H, W]`` and labels or None): every
    ``train.eval_interval`` steps and at the end, the EMA weights' ``val_bpd`` / ``val_mse`` on
    its first ``train.eval_num_images`` images, estimated exactly as a Ray run's rank 0 does.
    """
    device = device or torch.device("cpu")
    output_dir = output_dir.resolve()
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "config.json").write_text(json.dumps(to_dict(config), indent=2))
    seed_everything(config.train.seed)

    model = create_model(config.model, learn_sigma=config.diffusion.learn_sigma).to(device)
    diffusion = create_gaussian_diffusion(config.diffusion)
    # Sample grids as a Ray run makes them: train.sample_count images, DDIM train.sample_steps.
    num_preview_samples = num_preview_samples or config.train.sample_count
    preview = sampling_diffusion(diffusion, steps=preview_steps or config.train.sample_steps)
    sampler = create_named_schedule_sampler(
        config.train.schedule_sampler, diffusion, seed=config.train.seed
    )
    trainer = Trainer(
        model=model,
        diffusion=diffusion,
        sampler=sampler,
        optim=config.optim,
        train=config.train,
        local_batch_size=config.train.per_worker_batch(1),
        device=device,
    )
    logger.info(
        "model: %.2fM parameters; diffusion: T=%d %s, %s, %s",
        sum(p.numel() for p in model.parameters()) / 1e6,
        diffusion.original_num_steps,
        config.diffusion.noise_schedule,
        diffusion.model_mean_type.name,
        diffusion.loss_type.name,
    )

    ckpt_root = output_dir  # the same layout as a Ray Train run: DIR/checkpoint_NNNNNN
    resume = resume_point(ckpt_root, resume)
    # Data position (epoch, batches of it trained on); the caller's `batches` must start there
    # (see raydiff.cli: infinite_batches(start_epoch=..., skip_batches=...) from read_progress).
    position = DataPosition()
    if resume is not None:
        state = load_checkpoint(resume)
        trainer.restore(state)
        torch.set_rng_state(state["trainer"]["torch_rng"])
        if device.type == "cuda" and "cuda_rng" in state["trainer"]:
            # Dropout and q_sample noise on the GPU draw from its own generator.
            torch.cuda.set_rng_state(state["trainer"]["cuda_rng"], device)
        position = DataPosition.from_state(state["trainer"], global_batch=config.train.batch_size)
        logger.info("resumed from %s at step %d", resume, trainer.step)
    elif config.train.init_checkpoint:
        load_model_weights(model, config.train.init_checkpoint)
        trainer.ema = EMA(model, config.optim.ema_rates())
        logger.info("initialised the weights from %s", config.train.init_checkpoint)

    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(
        str(output_dir / "tensorboard"),
        # Events a failed attempt logged past the step this one starts from (its checkpoint,
        # or 0 for a run restarted before the first one) are dropped: without this
        # TensorBoard shows two curves over the same steps.
        purge_step=trainer.step + 1,
    )
    metrics = MetricAccumulator(num_timesteps=diffusion.num_timesteps)
    image_shape = (config.model.in_channels, config.model.image_size, config.model.image_size)
    num_classes = config.model.num_classes if config.model.class_cond else None
    last_report: dict[str, Any] = {}
    window = ThroughputWindow(config.train.batch_size)
    run_start, start_step = now(), trainer.step

    def checkpoint() -> Path:
        trainer_state = trainer.state_dict()
        trainer_state.update(position.state(global_batch=config.train.batch_size))
        trainer_state["torch_rng"] = torch.get_rng_state()
        if device.type == "cuda":
            trainer_state["cuda_rng"] = torch.cuda.get_rng_state(device)
        return save_checkpoint(
            ckpt_root,
            trainer.step,
            model_state=model.state_dict(),
            ema_states={r: trainer.ema.state_dict_for(r, model) for r in trainer.ema.rates},
            trainer_state=trainer_state,
            config=to_dict(config),
        )

    def sample_grid() -> Path:
        weights = trainer.eval_weights()
        images = ema_samples(
            model=model,
            ema_state=weights,
            diffusion=preview,
            num_samples=num_preview_samples,
            image_shape=image_shape,
            seed=config.train.seed,
            num_classes=num_classes,
        )
        path = save_grid(images, output_dir / "samples" / f"samples_{trainer.step:06d}.png")
        writer.add_images("samples/ema", (images.clamp(-1, 1) + 1) / 2, trainer.step)
        logger.info("wrote sample grid %s", path)
        return path

    eval_t = stratified_timesteps(
        diffusion.num_timesteps, config.train.eval_timesteps, seed=config.train.seed
    )
    val_batches: list[tuple[torch.Tensor, dict[str, torch.Tensor]]] = []
    if val_data is not None:
        val_images, val_labels = val_data
        for start in range(0, min(len(val_images), config.train.eval_num_images), 64):
            end = min(start + 64, config.train.eval_num_images)
            cond = {"y": val_labels[start:end].to(device)} if val_labels is not None else {}
            val_batches.append((val_images[start:end].to(device), cond))

    def evaluate() -> dict[str, float]:
        if not val_batches:
            return {}
        with weights_swapped(model, trainer.eval_weights()):
            totals = estimate_bpd(
                diffusion=diffusion,
                model=model,
                batches=val_batches,
                timesteps=eval_t,
                seed=config.train.seed,
            )
        return validation_metrics(totals)

    model.train()
    while trainer.step < config.train.max_steps:
        window.begin()
        epoch, x, cond = next(batches)
        window.data_ready()
        position.advance(epoch)
        result = trainer.train_step(x, cond)
        window.end()
        metrics.add_step(result)
        step = trainer.step
        last = step == config.train.max_steps
        is_eval = (config.train.eval_interval and step % config.train.eval_interval == 0) or last
        if step % config.train.log_interval == 0 or last or is_eval:
            report = metrics.flush()
            report.update(
                step=step,
                epoch=epoch,
                lr=result.lr,
                loss_scale=result.loss_scale,
                skipped_steps=trainer.skipped_steps,
                **window.read(),
            )
            if is_eval:
                report.update(evaluate())
            for key, value in report.items():
                if key != "step":
                    writer.add_scalar(f"train/{key}", value, step)
            done = step - start_step
            eta = (now() - run_start) / max(done, 1) * (config.train.max_steps - step)
            logger.info(
                "step %d/%d  %s  eta %s",
                step,
                config.train.max_steps,
                progress_fields(report),
                format_eta(eta),
            )
            last_report = report
        if step % config.train.save_interval == 0 and step < config.train.max_steps:
            logger.info("saved %s", checkpoint())
        if config.train.sample_interval and step % config.train.sample_interval == 0:
            sample_grid()

    final = checkpoint()
    logger.info("saved %s", final)
    grid = sample_grid()
    writer.close()
    return {**last_report, "checkpoint": str(final), "samples": str(grid)}
