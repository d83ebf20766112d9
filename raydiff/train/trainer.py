"""The per-worker training step: microbatching, mixed precision, importance weights, EMA.

No Ray here. The orchestration layer hands a ``Trainer`` its (optionally DDP-wrapped) model, a
batch iterator and a loss sync for the timestep sampler; a plain loop drives it in a single
process (see ``raydiff.train.loop``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from raydiff.config import OptimConfig, TrainConfig
from raydiff.core.gaussian_diffusion import GaussianDiffusion
from raydiff.core.timestep_sampler import LossSync, ScheduleSampler
from raydiff.seeding import derive_seed
from raydiff.train.ema import EMA
from raydiff.train.optimizer import build_optimizer
from raydiff.train.precision import PrecisionPolicy

logger = logging.getLogger(__name__)


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


@dataclass
class MetricAccumulator:
    """Running sums of the step metrics between two reports.

    Sums stay tensors on the training device, so adding a step costs no host sync (that matters
    on GPU); they are read once per report in ``flush``.
    """

    num_timesteps: int
    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    counts: dict[str, torch.Tensor] = field(default_factory=dict)

    def _add(self, name: str, value: torch.Tensor, count: torch.Tensor) -> None:
        value, count = value.detach().double(), count.detach().double()
        if name in self.sums:
            self.sums[name] += value
            self.counts[name] += count
        else:
            self.sums[name], self.counts[name] = value.clone(), count.clone()

    def add_step(self, result: StepResult) -> None:
        # improved-diffusion's log_loss_dict: each term's mean, and its mean per quartile of t,
        # of the importance-weighted terms (what the step optimises; with a non-uniform sampler
        # the raw terms over-count the timesteps it draws most).
        quartile = (4 * result.timesteps // self.num_timesteps).clamp(max=3)
        onehot = torch.nn.functional.one_hot(quartile, 4).double()  # [B, 4]
        weights = result.weights.double()
        for key, values in result.losses.items():
            values = values.double() * weights
            # Slot 0: the whole batch; slots 1-4: quartiles (present even when empty, so that all
            # ranks reduce the same keys).
            sums = torch.cat([values.sum().view(1), values @ onehot])  # [5]
            counts = torch.cat([torch.ones_like(values).sum().view(1), onehot.sum(0)])
            self._add(key, sums, counts)
        if result.stepped:
            self._add(
                "grad_norm", result.grad_norm.view(1), torch.ones(1, device=result.grad_norm.device)
            )

    def flush(
        self, reduce: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None
    ) -> dict[str, float]:
        """Means since the last flush; ``reduce`` sums the totals over workers first."""
        packed = {f"s:{k}": v for k, v in self.sums.items()}
        packed.update({f"n:{k}": v for k, v in self.counts.items()})
        self.sums, self.counts = {}, {}
        if reduce is not None:
            packed = reduce(packed)
        out: dict[str, float] = {}
        for key in sorted(k[2:] for k in packed if k.startswith("s:")):
            sums = packed[f"s:{key}"].cpu().tolist()
            counts = packed[f"n:{key}"].cpu().tolist()
            names = [key] if len(sums) == 1 else [key, *(f"{key}_q{q}" for q in range(4))]
            for name, total, count in zip(names, sums, counts, strict=True):
                # A bin that no sample fell into has no mean: leave it out rather than report 0.
                if count > 0:
                    out[name] = total / count
        return out


@dataclass
class DataPosition:
    """Where a run is in its data: the epoch and how many of its batches were trained on.

    Saved in every checkpoint as ``epoch`` and ``epoch_samples`` (global samples, so a run resumed
    on another number of workers skips the same amount of the epoch).
    """

    epoch: int = 0
    batches: int = 0

    @classmethod
    def from_state(cls, state: dict[str, Any], *, global_batch: int) -> DataPosition:
        """From a checkpoint's trainer state (or its progress.json); zeros when absent."""
        return cls(
            epoch=int(state.get("epoch", 0)),
            batches=int(state.get("epoch_samples", 0)) // global_batch,
        )

    def advance(self, epoch: int) -> None:
        """Count one batch of ``epoch`` (a new epoch starts the count again)."""
        if epoch != self.epoch:
            self.epoch, self.batches = epoch, 0
        self.batches += 1

    def state(self, *, global_batch: int) -> dict[str, int]:
        """The checkpoint entries: ``epoch`` and ``epoch_samples``."""
        return {"epoch": self.epoch, "epoch_samples": self.batches * global_batch}


class ThroughputWindow:
    """Images/s, step time and data-wait share over the steps since the last ``read``.

    Only time inside steps counts (waiting for the batch + the optimiser step), so evaluation,
    sample grids, checkpoints and report barriers between steps do not dilute the figures.
    """

    def __init__(self, images_per_step: int) -> None:
        self.images_per_step = images_per_step
        self._reset()

    def _reset(self) -> None:
        self.steps, self.busy, self.data_wait = 0, 0.0, 0.0

    def begin(self) -> None:
        """Call before fetching the step's batch."""
        self._t0 = time.perf_counter()

    def data_ready(self) -> None:
        """Call once the batch is there."""
        self._t1 = time.perf_counter()

    def end(self) -> None:
        """Call after the optimiser step."""
        t2 = time.perf_counter()
        self.steps += 1
        self.busy += t2 - self._t0
        self.data_wait += self._t1 - self._t0

    def read(self) -> dict[str, float]:
        """The window's figures; starts a new window."""
        busy = max(self.busy, 1e-9)
        out = {
            "images_per_s": self.steps * self.images_per_step / busy,
            "step_time": busy / max(self.steps, 1),
            "data_wait_fraction": self.data_wait / busy,
        }
        self._reset()
        return out


class Trainer:
    """Owns the optimiser, precision policy, EMA and sampler of one worker.

    :param model: the module to call for the loss: the DDP wrapper on several workers.
    :param raw_model: the unwrapped module (for EMA and checkpoints); defaults to ``model``.
    :param local_batch_size: this worker's share of the global batch.
    :param rank: this worker's rank; it keys the worker's random streams.
    :param loss_sync: gathers (t, loss) across workers for a loss-aware sampler.

    Every random draw of a step (dropout, the q_sample noise, the timesteps) comes from streams
    seeded by (``train.seed``, rank, step) at the start of the step. A run resumed at step k, on
    any number of workers, therefore draws exactly what the uninterrupted run drew at step k, and
    no generator state needs saving.
    """

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        diffusion: GaussianDiffusion,
        sampler: ScheduleSampler,
        optim: OptimConfig,
        train: TrainConfig,
        local_batch_size: int,
        device: torch.device,
        raw_model: torch.nn.Module | None = None,
        rank: int = 0,
        loss_sync: LossSync | None = None,
    ) -> None:
        self.model = model
        self.raw_model = raw_model if raw_model is not None else model
        self.diffusion = diffusion
        self.sampler = sampler
        self.optim_config = optim
        self.train_config = train
        self.device = device
        self.local_batch_size = local_batch_size
        self.rank = rank
        self.microbatch = train.microbatch if train.microbatch > 0 else local_batch_size
        if local_batch_size % self.microbatch:
            raise ValueError(
                f"per-worker batch {local_batch_size} must be divisible by "
                f"microbatch={self.microbatch}"
            )
        self.loss_sync = loss_sync
        self.precision = PrecisionPolicy(
            train.precision, device=device, init_scale=train.initial_loss_scale
        )
        self.optimizer = build_optimizer(self.raw_model.parameters(), optim=optim)
        self.ema = EMA(self.raw_model, optim.ema_rates())
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

    def train_step(
        self, x_start: torch.Tensor, cond: dict[str, torch.Tensor] | None = None
    ) -> StepResult:
        """One optimiser step over this worker's batch ``x_start`` ``[B, C, H, W]``."""
        cond = cond or {}
        if x_start.shape[0] != self.local_batch_size:
            raise ValueError(
                f"expected a local batch of {self.local_batch_size}, got {x_start.shape[0]}"
            )
        seed = self.train_config.seed
        torch.manual_seed(derive_seed(seed, "step", self.rank, self.step))  # dropout, noise
        self.sampler.generator.manual_seed(derive_seed(seed, "timesteps", self.rank, self.step))
        lr = self.lr_at(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)

        all_t, all_weights, all_terms = [], [], {}
        num_micro = self.local_batch_size // self.microbatch
        for i in range(num_micro):
            sl = slice(i * self.microbatch, (i + 1) * self.microbatch)
            micro = x_start[sl].to(self.device, non_blocking=True)
            micro_cond = {k: v[sl].to(self.device, non_blocking=True) for k, v in cond.items()}
            t, weights = self.sampler.sample(micro.shape[0], self.device)
            last = i == num_micro - 1
            # DDP: all-reduce gradients only once, after the last microbatch.
            sync_ctx = (
                self.model.no_sync()
                if not last and hasattr(self.model, "no_sync")
                else contextlib.nullcontext()
            )
            with sync_ctx:
                with self.precision.autocast():
                    terms = self.diffusion.training_losses(
                        self.model, micro, t, model_kwargs=micro_cond
                    )
                    # Importance weights keep the objective unbiased; dividing by the number
                    # of microbatches makes the gradient the mean over the local batch,
                    # independent of how it is split.
                    loss = (terms["loss"].float() * weights).mean() / num_micro
                self.precision.scale(loss).backward()
            all_t.append(t)
            all_weights.append(weights.detach().float())
            for key, value in terms.items():
                all_terms.setdefault(key, []).append(value.detach().float())

        timesteps = torch.cat(all_t)
        losses = {k: torch.cat(v) for k, v in all_terms.items()}
        self.sampler.record_losses(timesteps, losses["loss"], sync=self.loss_sync)

        self.precision.unscale_(self.optimizer)
        grad_norm = self._grad_norm()
        grads_finite = bool(torch.isfinite(grad_norm))
        if grads_finite and self.optim_config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), self.optim_config.grad_clip)
        stepped = self.precision.step(self.optimizer, grads_finite=grads_finite)
        self.step += 1
        if stepped:
            self.ema.update(self.raw_model)
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
        return StepResult(
            stepped=stepped,
            losses=losses,
            timesteps=timesteps,
            weights=torch.cat(all_weights),
            grad_norm=grad_norm,
            lr=lr,
            loss_scale=self.precision.loss_scale,
        )

    def _grad_norm(self) -> torch.Tensor:
        grads = [p.grad for p in self.raw_model.parameters() if p.grad is not None]
        if not grads:
            return torch.zeros((), device=self.device)
        norms = torch._foreach_norm(grads)
        return torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))

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

    def weight_fingerprint(self) -> torch.Tensor:
        """``[sum(w), sum(w^2)]`` over the model's parameters, float64 on the CPU.

        Data-parallel ranks apply the same all-reduced gradients to the same weights, so their
        fingerprints are bitwise equal; any difference means the ranks diverged.
        """
        with torch.no_grad():
            params = [p.detach().double() for p in self.raw_model.parameters()]
            total = torch.stack([p.sum() for p in params]).sum()
            squares = torch.stack([(p * p).sum() for p in params]).sum()
        return torch.stack([total, squares]).cpu()

    def eval_weights(self) -> dict[str, torch.Tensor]:
        """Weights for validation and samples: the first EMA rate's, or the model's without EMA."""
        if not self.ema.rates:
            return {k: v.detach().clone() for k, v in self.raw_model.state_dict().items()}
        return self.ema.state_dict_for(self.ema.rates[0], self.raw_model)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Everything but the model and EMA weights (those are saved as model state dicts)."""
        return {
            "step": self.step,
            "skipped_steps": self.skipped_steps,
            "optimizer": self.optimizer.state_dict(),
            "precision": self.precision.state_dict(),
            "sampler": self.sampler.state_dict(),
        }

    def restore(self, checkpoint: dict[str, Any]) -> None:
        """Continue from a loaded checkpoint (``raydiff.train.checkpoint.load_checkpoint``):
        model weights, every EMA rate, optimiser, scaler, sampler and step.

        An EMA rate the checkpoint lacks (one added to ``optim.ema_rate`` since) starts from the
        restored weights, not from the weights this trainer was built with.
        """
        self.raw_model.load_state_dict(checkpoint["model"])
        for rate in self.ema.rates:
            if rate in checkpoint["ema"]:
                self.ema.load_state_dict_for(rate, checkpoint["ema"][rate])
            else:
                logger.warning(
                    "the checkpoint has no EMA at rate %s: starting it from the restored weights",
                    rate,
                )
                self.ema.load_state_dict_for(rate, checkpoint["model"])
        self.load_state_dict(checkpoint["trainer"])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.skipped_steps = int(state["skipped_steps"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.precision.load_state_dict(state["precision"])
        self.sampler.load_state_dict(state["sampler"])


def progress_fields(metrics: dict[str, Any]) -> str:
    """The metrics a progress line shows, those present only (an eval-only step has no loss)."""
    fields = []
    for key, fmt in (
        ("loss", "loss {:.4f}"),
        ("mse", "mse {:.4f}"),
        ("val_bpd", "val_bpd {:.3f}"),
        ("images_per_s", "{:.0f} img/s"),
        ("lr", "lr {:.2e}"),
    ):
        if key in metrics:
            fields.append(fmt.format(metrics[key]))
    return "  ".join(fields)


def format_eta(seconds: float) -> str:
    """``1h02m`` / ``4m05s`` / ``12s``."""
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def now() -> float:
    return time.perf_counter()
