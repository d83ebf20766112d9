"""Config and task -> a ready ``RankOptimizer`` for one rank: the task's model and loss, the timestep
sampler, optimiser, EMA.

The one assembly used by the training loop (every runtime) and the benchmarks. Resuming is
``RankOptimizer.restore`` (weights, every EMA rate, optimiser, loss scaler, sampler, step) plus the data
position of the checkpoint; random streams need no restoring (see ``RankOptimizer``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from raydiff.config import ExperimentConfig, compile_wanted
from raydiff.seeding import derive_seed
from raydiff.train.checkpoint import load_model_weights
from raydiff.train.rank_optimizer import RankOptimizer
from raydiff.train.task import Task, TaskFactory
from raydiff.train.tasks import task_spec

if TYPE_CHECKING:
    from raydiff.train.runtime import Runtime

logger = logging.getLogger(__name__)


def build_rank_optimizer(
    config: ExperimentConfig, *, runtime: Runtime, make_task: TaskFactory, fresh: bool = True
) -> tuple[Task, RankOptimizer]:
    """The task of ``config`` and the trainer of ``runtime``'s rank for it.

    Every rank builds the same initial weights (``make_task`` runs seeded by ``train.seed``; DDP
    would broadcast rank 0's anyway). ``fresh``: the run starts without a checkpoint, so
    ``train.init_checkpoint`` (when set) provides the starting weights; a resumed run's weights
    come from its checkpoint.
    """
    torch.manual_seed(derive_seed(config.train.seed, "init"))
    task = make_task(config, runtime=runtime)
    model = task.model
    if fresh and config.train.init_checkpoint:
        load_model_weights(model, config.train.init_checkpoint)
        logger.info("initialised the weights from %s", config.train.init_checkpoint)
    wrapped = runtime.wrap_model(model)
    compiled = compile_wanted(config.train.compile, cuda=runtime.device.type == "cuda")
    diffusion = task.diffusion
    sampler = runtime.schedule_sampler(
        diffusion, seed=derive_seed(config.train.seed, "timesteps", runtime.rank), fresh=fresh
    )
    trainer = RankOptimizer(
        model=wrapped,
        raw_model=model,
        losses=task.losses,
        sampler=sampler,
        optim=config.optim,
        train=config.train,
        local_batch_size=config.train.per_worker_batch(runtime.world_size),
        device=runtime.device,
        rank=runtime.rank,
        world_size=runtime.world_size,
        compile_step=compiled,
    )
    logger.info(
        "%s: %.2fM parameters; diffusion: T=%d %s; %s; %d worker(s), %d images each, %s%s",
        config.train.task,
        sum(p.numel() for p in model.parameters()) / 1e6,
        config.diffusion.diffusion_steps,
        config.diffusion.noise_schedule,
        task_spec(config.train.task).describe(config),
        runtime.world_size,
        trainer.local_batch_size,
        trainer.precision.precision,
        ", compiled" if compiled else "",
    )
    if trainer.posthoc_ema is not None:
        log_posthoc_ema_plan(config, num_parameters=sum(p.numel() for p in model.parameters()))
    return task, trainer


def log_posthoc_ema_plan(config: ExperimentConfig, *, num_parameters: int) -> None:
    """What the post-hoc EMA snapshots will weigh at ``train.max_steps``: each holds every
    tracked profile in fp16 (2 bytes a parameter)."""
    sigma_rels = config.optim.posthoc_sigma_rels()
    interval = config.optim.posthoc_ema_interval or config.train.save_interval
    max_steps = config.train.max_steps
    count = max_steps // interval if interval else 0
    count += 0 if interval and max_steps % interval == 0 else 1  # the last step's
    each = 2 * num_parameters * len(sigma_rels)
    logger.info(
        "post-hoc EMA: profiles sigma_rel %s, a snapshot every %s steps: %d snapshots of %.1f MB "
        "(%.2f GB) by step %d, in posthoc_ema/",
        ", ".join(f"{s:.3f}" for s in sigma_rels),
        interval or max_steps,
        count,
        each / 1e6,
        count * each / 1e9,
        max_steps,
    )
