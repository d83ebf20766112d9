"""The per-rank optimiser step, which the one training loop drives on every rank: microbatching,
mixed precision, importance weights, the averages (built by ``raydiff.train.build``). No Ray.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from raydiff.config import OptimConfig, TrainConfig
from raydiff.core.keyed_noise import RowNoise, row_keys
from raydiff.core.timestep_sampler import ScheduleSampler
from raydiff.seeding import derive_seed
from raydiff.train.compilation import compile_static
from raydiff.train.ema import EMA, Averager
from raydiff.train.posthoc_ema import PowerFunctionEMA
from raydiff.train.precision import PrecisionPolicy
from raydiff.train.task import Batch, Losses

logger = logging.getLogger(__name__)


def build_optimizer(
    params: Iterable[torch.nn.Parameter], *, optim: OptimConfig
) -> torch.optim.AdamW:
    """AdamW with the config's lr, weight decay and betas (improved-diffusion's optimiser).

    Uses the fused implementation (one kernel for all parameters instead of ~10 ops per
    parameter: 3x faster on CPU here, and available on CUDA). The learning-rate schedule is the
    trainer's job; this sets the peak lr.
    """
    beta1, beta2 = optim.adam_beta_tuple()
    return torch.optim.AdamW(
        params, lr=optim.lr, weight_decay=optim.weight_decay, betas=(beta1, beta2), fused=True
    )


class TrainingCollapsedError(RuntimeError):
    """Training cannot make progress (every step skipped, or the fp16 loss scale collapsed)."""


class RanksOutOfSyncError(RuntimeError):
    """Data-parallel ranks hold different weights (checked at every checkpoint)."""


@dataclass
class StepResult:
    """What one optimiser step did. Tensors stay on the device until someone logs them."""

    stepped: bool
    losses: dict[str, torch.Tensor]  # per-sample terms over the local batch, detached, unweighted
    timesteps: torch.Tensor
    weights: torch.Tensor  # the schedule sampler's importance weights, one per sample
    grad_norm: torch.Tensor
    lr: float
    loss_scale: float


class RankOptimizer:
    """Owns the optimiser, precision policy, EMA and sampler of one worker.

    :param model: the module to call for the loss: the DDP wrapper on several workers.
    :param losses: the task's per-sample loss terms of a microbatch (``Task.losses``).
    :param raw_model: the unwrapped module (for EMA and checkpoints); defaults to ``model``.
    :param local_batch_size: this worker's share of the global batch.
    :param rank, world_size: this worker's place in the data-parallel group.
    :param compile_step: the step calls ``model`` compiled (``train.compile``); ``raw_model``,
        which EMA and checkpoints use (and evaluation, through a compiled view of it), stays
        the uncompiled module.

    Every random draw of a step is seeded at the start of the step, so a run resumed at step k
    draws what the uninterrupted run drew at step k and no generator state needs saving; the
    timesteps, noise and augmentations are keyed by the row of the global batch, so a run resized
    mid-way trains as the fixed-size run does (docs/architecture.md names each stream).
    """

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        losses: Losses,
        sampler: ScheduleSampler,
        optim: OptimConfig,
        train: TrainConfig,
        local_batch_size: int,
        device: torch.device,
        raw_model: torch.nn.Module | None = None,
        rank: int = 0,
        world_size: int = 1,
        compile_step: bool = False,
    ) -> None:
        self.raw_model = raw_model if raw_model is not None else model
        self.compiled = compile_step
        self.model = compile_static(model) if compile_step else model
        self.losses = losses
        self.sampler = sampler
        self.optim_config = optim
        self.train_config = train
        self.device = device
        self.local_batch_size = local_batch_size
        self.rank, self.world_size = rank, world_size
        self.microbatch = train.microbatch if train.microbatch > 0 else local_batch_size
        if local_batch_size % self.microbatch:
            raise ValueError(
                f"per-worker batch {local_batch_size} must be divisible by "
                f"microbatch={self.microbatch}"
            )
        self.precision = PrecisionPolicy(
            train.precision, device=device, init_scale=train.initial_loss_scale
        )
        self.optimizer = build_optimizer(self.raw_model.parameters(), optim=optim)
        self.ema = EMA(self.raw_model, optim.ema_rates())
        # Post-hoc EMA profiles (EDM2): on the main rank only, which alone checkpoints them and
        # writes their snapshots; every rank holds the same weights after a step anyway.
        sigma_rels = optim.posthoc_sigma_rels()
        self.posthoc_ema = (
            PowerFunctionEMA(self.raw_model, sigma_rels=sigma_rels)
            if sigma_rels and rank == 0
            else None
        )
        # Every average, updated, saved and restored alike (raydiff.train.ema.Averager).
        self.averagers: list[Averager] = [self.ema, *filter(None, [self.posthoc_ema])]
        self.step = 0  # optimiser steps taken (skipped ones included)
        self.skipped_steps = 0
        self.consecutive_skipped = 0

    # ------------------------------------------------------------------ schedule

    def lr_at(self, step: int) -> float:
        """Linear warm-up, then improved-diffusion's linear anneal to 0 over lr_anneal_steps."""
        lr = self.optim_config.lr
        if self.optim_config.warmup_steps and step < self.optim_config.warmup_steps:
            lr = lr * (step + 1) / self.optim_config.warmup_steps
        if self.optim_config.lr_anneal_steps:
            lr = lr * max(0.0, 1.0 - step / self.optim_config.lr_anneal_steps)
        return lr

    # ------------------------------------------------------------------ one step

    def optimize(self, batch: Batch) -> StepResult:
        """One optimiser step over this worker's batch (``x`` ``[B, C, H, W]`` and the rest)."""
        if batch["x"].shape[0] != self.local_batch_size:
            raise ValueError(
                f"expected a local batch of {self.local_batch_size}, got {batch['x'].shape[0]}"
            )
        lr = self._begin_step()
        timesteps, weights, losses = self._accumulate_gradients(batch)
        self.sampler.record_losses(timesteps, losses["loss"])
        grad_norm, stepped = self._apply_gradients()
        return StepResult(
            stepped=stepped,
            losses=losses,
            timesteps=timesteps,
            weights=weights,
            grad_norm=grad_norm,
            lr=lr,
            loss_scale=self.precision.loss_scale,
        )

    def _begin_step(self) -> float:
        """Seed the step's random streams, set its learning rate, clear the gradients."""
        seed = self.train_config.seed
        torch.manual_seed(derive_seed(seed, "step", self.rank, self.step))  # dropout
        self.sampler.generator.manual_seed(derive_seed(seed, "timesteps", self.step))
        lr = self.lr_at(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        return lr

    def _accumulate_gradients(
        self, batch: Batch
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Backward over every microbatch: the timesteps, importance weights and per-sample
        loss terms of the whole local batch."""
        all_t, all_weights, all_terms = [], [], {}
        step_t, step_weights, step_noise, augment_seeds = self._draw_for_batch(batch["x"])
        num_micro = self.local_batch_size // self.microbatch
        for i in range(num_micro):
            sl = slice(i * self.microbatch, (i + 1) * self.microbatch)
            micro = {k: v[sl].to(self.device, non_blocking=True) for k, v in batch.items()}
            micro["noise"] = step_noise[sl]
            micro["augment_seed"] = augment_seeds[sl]  # on the CPU: read as integers
            t, weights = step_t[sl], step_weights[sl]
            last = i == num_micro - 1
            # DDP: all-reduce gradients only once, after the last microbatch.
            sync_ctx = (
                self.model.no_sync()
                if not last and hasattr(self.model, "no_sync")
                else contextlib.nullcontext()
            )
            with sync_ctx:
                with self.precision.autocast():
                    terms = self.losses(self.model, micro, t)
                    # Importance weights keep the objective unbiased; dividing by the number
                    # of microbatches makes the gradient the mean over the local batch,
                    # independent of how it is split.
                    loss = (terms["loss"].float() * weights).mean() / num_micro
                self.precision.scale(loss).backward()
            all_t.append(t)
            all_weights.append(weights.detach().float())
            for key, value in terms.items():
                all_terms.setdefault(key, []).append(value.detach().float())
        losses = {k: torch.cat(v) for k, v in all_terms.items()}
        return torch.cat(all_t), torch.cat(all_weights), losses

    def _draw_for_batch(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's timesteps, importance weights, noise and augmentation seeds (int64, CPU):
        the timesteps drawn for the whole global batch (a few integers a row), the noise and
        seeds for this rank's rows only, each keyed by (seed, step, row of the global batch)."""
        first = self.rank * self.local_batch_size
        rows = range(first, first + self.local_batch_size)
        t, weights = self.sampler.sample(self.local_batch_size * self.world_size, self.device)
        mine = slice(first, first + self.local_batch_size)
        seed, step = self.train_config.seed, self.step
        # One vectorised draw for all the rows (raydiff.core.keyed_noise), not a generator each.
        augment_seeds = row_keys(derive_seed(seed, "augment", step, bits=64), rows, device="cpu")
        noise = RowNoise.for_rows(
            derive_seed(seed, "noise", step, bits=64), rows, device=self.device
        ).draw(tuple(x.shape))
        return t[mine], weights[mine], noise, augment_seeds

    def _apply_gradients(self) -> tuple[torch.Tensor, bool]:
        """Unscale, clip and step (or skip a step with non-finite gradients); EMA after a step.
        Returns the gradient norm and whether the optimiser stepped."""
        self.precision.unscale_(self.optimizer)
        grads = [p.grad for p in self.raw_model.parameters() if p.grad is not None]
        # The total 2-norm, in fp32 whatever the gradients' dtype.
        grad_norm = (
            torch.linalg.vector_norm(torch.stack([n.float() for n in torch._foreach_norm(grads)]))
            if grads
            else torch.zeros((), device=self.device)
        )
        grads_finite = bool(torch.isfinite(grad_norm))
        if grads_finite and self.optim_config.grad_clip > 0 and grads:
            # clip_grad_norm_'s scaling, with the norm above: the norm is computed once a step.
            clip = self.optim_config.grad_clip / (grad_norm + 1e-6)
            torch._foreach_mul_(grads, torch.clamp(clip, max=1.0))
        stepped = self.precision.step(self.optimizer, grads_finite=grads_finite)
        self.step += 1
        for averager in self.averagers:
            averager.update(self.raw_model, step=self.step, stepped=stepped)
        if stepped:
            self.consecutive_skipped = 0
        else:
            self.skipped_steps += 1
            self.consecutive_skipped += 1
            logger.warning(
                "step %d skipped: non-finite gradients (loss scale now %g, %d skipped in a row)",
                self.step,
                self.precision.loss_scale,
                self.consecutive_skipped,
            )
            self._check_collapse()
        return grad_norm, stepped

    def _check_collapse(self) -> None:
        limit = self.train_config.max_consecutive_skipped
        if self.consecutive_skipped >= limit:
            raise TrainingCollapsedError(
                f"{self.consecutive_skipped} consecutive steps had non-finite gradients "
                f"(train.max_consecutive_skipped={limit}); the run is diverging. Lower optim.lr, "
                "set optim.grad_clip, or use precision=bf16/fp32."
            )
        if (
            self.precision.scaler is not None
            and self.precision.loss_scale < self.train_config.min_loss_scale
        ):
            raise TrainingCollapsedError(
                f"the fp16 loss scale collapsed to {self.precision.loss_scale:g} "
                f"(< train.min_loss_scale={self.train_config.min_loss_scale:g}): every step "
                "overflows. Use precision=bf16 or fp32, lower optim.lr, or set optim.grad_clip."
            )

    def rank_fingerprints(
        self, all_reduce_sum: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
    ) -> list[list[float]]:
        """With ``Runtime.all_reduce_sum``: every rank's ``[sum(w), sum(w^2)]`` over the model's parameters (float64; a
        collective: all ranks call it). Data-parallel ranks apply the same all-reduced gradients
        to the same weights, so their fingerprints are bitwise equal; ranks that differ diverged
        and stop the run, which then restarts from its last checkpoint."""
        with torch.no_grad():
            params = [p.detach().double() for p in self.raw_model.parameters()]
            total = torch.stack([p.sum() for p in params]).sum()
            squares = torch.stack([(p * p).sum() for p in params]).sum()
        table = torch.zeros(self.world_size, 2, dtype=torch.float64)
        table[self.rank] = torch.stack([total, squares]).cpu()
        table = all_reduce_sum({"weights": table})["weights"].reshape(-1, 2)
        if not torch.equal(table, table[:1].expand_as(table)):
            raise RanksOutOfSyncError(
                f"at step {self.step} the data-parallel ranks hold different weights "
                f"(sum, sum of squares per rank: {table.tolist()}); the run restarts from its "
                "last checkpoint, whose weights every rank loads"
            )
        return table.tolist()

    def eval_weights(self) -> dict[str, torch.Tensor]:
        """Weights for validation and samples: the first averager's that gives some (the first
        EMA rate's), or the model's."""
        for averager in self.averagers:
            weights = averager.evaluation_weights(self.raw_model)
            if weights is not None:
                return weights
        return {k: v.detach().clone() for k, v in self.raw_model.state_dict().items()}

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Everything but the model and the averages (those are :meth:`checkpoint`'s)."""
        return {
            "step": self.step,
            "skipped_steps": self.skipped_steps,
            "optimizer": self.optimizer.state_dict(),
            "precision": self.precision.state_dict(),
            "sampler": self.sampler.state_dict(),
        }

    def checkpoint(self) -> dict[str, Any]:
        """What a checkpoint keeps of this trainer, keyed as :meth:`restore` takes it back:
        ``model`` (weights), ``ema`` (``ema_<rate>`` weights), ``trainer`` (``trainer.pt``)."""
        state: dict[str, Any] = {"model": self.raw_model.state_dict(), "ema": {}}
        state["trainer"] = self.state_dict()
        for averager in self.averagers:
            for key, part in averager.saved(self.raw_model).items():
                state[key].update(part)
        return state

    def restore(self, checkpoint: dict[str, Any]) -> None:
        """Continue from a loaded checkpoint (``raydiff.train.checkpoint.load_checkpoint``):
        model weights, every average, optimiser, scaler, sampler and step."""
        self.raw_model.load_state_dict(checkpoint["model"])
        for averager in self.averagers:
            averager.restore(checkpoint, self.raw_model)
        self.load_state_dict(checkpoint["trainer"])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.skipped_steps = int(state["skipped_steps"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.precision.load_state_dict(state["precision"])
        self.sampler.load_state_dict(state["sampler"])
