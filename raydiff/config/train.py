"""The train section: what is trained, batch, precision, length and intervals."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from raydiff.config.field_values import invalid

Precision = Literal["fp32", "fp16", "bf16", "auto"]
TaskName = Literal["diffusion", "classifier", "super_res"]
ScheduleSamplerName = Literal["uniform", "loss-second-moment"]
CompileMode = Literal["auto", "true", "false"]


def compile_wanted(mode: CompileMode, *, cuda: bool) -> bool:
    """Whether ``mode`` (``train.compile``, ``raydiff sample --compile``) compiles a model that
    runs on a CUDA device (``cuda``) or on the CPU: ``auto`` compiles on CUDA only. On a 2-core
    CPU the compile takes minutes, more than it saves in a run of the demo's length
    (docs/performance.md)."""
    return cuda if mode == "auto" else mode == "true"


@dataclass(kw_only=True, frozen=True)
class TrainConfig:
    """The training run: what is trained, batch, precision, length, intervals."""

    task: TaskName = "diffusion"
    """What is trained: 'diffusion' (the model section's UNet), 'classifier' (guided-diffusion's
    noisy classifier of the classifier section, on the data's labels) or 'super_res' (the model
    section's UNet as an upsampler: ``SuperResModel``, conditioned on each image shrunk to
    ``super_res.small_size``)."""
    batch_size: int = 64
    """Global batch size (over all workers); per-worker batches are derived from it. The one
    default that differs from improved-diffusion's (its image_train.py has 1, a per-process
    batch; its published runs set it)."""
    microbatch: int = -1
    """Per-worker microbatch for gradient accumulation (-1: no accumulation)."""
    precision: Precision = "fp32"
    """fp32, bf16 (autocast), fp16 (autocast + dynamic loss scaling), or auto: bf16 where the
    device computes it natively (GPUs with bf16, CPUs with AVX512-BF16/AMX), else fp16 on a GPU
    and fp32 on a CPU (bf16 without native kernels is 10-40x slower than fp32 there)."""
    schedule_sampler: ScheduleSamplerName = "uniform"
    """Timestep sampler: 'uniform' or 'loss-second-moment' (IDDPM section 3.3)."""
    max_steps: int = 1000
    """Stop after this many optimiser steps."""
    log_interval: int = 10
    """Steps between metric reports."""
    save_interval: int = 10000
    """Steps between checkpoints."""
    sample_interval: int = 0
    """Steps between EMA sample grids (0: only at the end)."""
    seed: int = 0
    """Seed of every random number generator."""
    init_checkpoint: str = ""
    """Start from these weights (a raydiff model.pt or a published improved-/guided-diffusion
    model*.pt / ema_*.pt, with the flags it was trained with); ignored when resuming."""
    max_consecutive_skipped: int = 50
    """Stop when this many steps in a row had non-finite gradients."""
    eval_interval: int = 0
    """Steps between validation bits/dim estimates on the EMA weights (0: only at the end)."""
    eval_num_images: int = 256
    """Validation images per evaluation (over all workers)."""
    eval_timesteps: int = 10
    """Timesteps per image for the bits/dim estimate (t = T-1 and geometric strata of the rest)."""
    sample_count: int = 64
    """Images in each sample grid."""
    sample_steps: int = 50
    """DDIM steps for the sample grids."""
    initial_loss_scale: float = 2.0**16
    """fp16: the dynamic loss scale to start from (halved on overflow, doubled every 2000 good steps)."""
    min_loss_scale: float = 1.0
    """fp16: stop when the dynamic loss scale falls below this."""
    compile: CompileMode = "auto"
    """torch.compile the model for the training step: true, false, or auto (on with CUDA,
    scaling.use_gpu; off on CPUs, where the compile takes minutes: more than it saves in a short
    run). Shapes are static (one compile per run); the compiled artefacts are kept in the run
    folder's compile_cache/ for restarts and resumes. Checkpoints and EMA use the uncompiled
    module; validation and previews a compiled view of it (previews autocast in precision,
    validation stays fp32)."""

    def __post_init__(self) -> None:
        s = "train"
        if self.batch_size < 1:
            raise invalid(s, "batch_size", self.batch_size, "must be >= 1")
        if self.microbatch == 0 or self.microbatch < -1:
            raise invalid(s, "microbatch", self.microbatch, "must be -1 (off) or >= 1")
        for name, valid in (
            ("task", TaskName),
            ("precision", Precision),
            ("schedule_sampler", ScheduleSamplerName),
            ("compile", CompileMode),
        ):
            if getattr(self, name) not in get_args(valid):
                raise invalid(s, name, getattr(self, name), f"valid: {', '.join(get_args(valid))}")
        ones = ("max_steps", "log_interval", "save_interval", "eval_num_images", "eval_timesteps")
        for name in (*ones, "sample_count", "max_consecutive_skipped"):
            if getattr(self, name) < 1:
                raise invalid(s, name, getattr(self, name), "must be >= 1")
        for name in ("sample_interval", "eval_interval"):
            if getattr(self, name) < 0:
                raise invalid(s, name, getattr(self, name), "must be >= 0 (0: only at the end)")
        if self.sample_steps < 2:  # a one-step chain has no posterior (see DiffusionConfig)
            raise invalid(s, "sample_steps", self.sample_steps, "must be >= 2")
        if self.seed < 0:
            raise invalid(s, "seed", self.seed, "must be >= 0")
        for name in ("initial_loss_scale", "min_loss_scale"):
            if not getattr(self, name) > 0:
                raise invalid(s, name, getattr(self, name), "must be > 0")

    def per_worker_batch(self, num_workers: int) -> int:
        """Batch per worker; the global batch must split evenly into workers x microbatches."""
        if self.batch_size % num_workers:
            raise invalid(
                "train",
                "batch_size",
                self.batch_size,
                f"must be divisible by the number of workers ({num_workers})",
            )
        local = self.batch_size // num_workers
        if self.microbatch > 0 and local % self.microbatch:
            raise invalid(
                "train",
                "batch_size",
                self.batch_size,
                f"per-worker batch {local} (batch_size / {num_workers} workers) must be divisible "
                f"by microbatch={self.microbatch}",
            )
        return local

    def check_worker_sizes(self, sizes: range) -> None:
        """The batch splits over every size in ``sizes`` (an elastic run's worker counts), or one
        error naming the sizes that cannot split it and the nearest batch that splits them all."""
        step = math.lcm(*sizes) * max(self.microbatch, 1)
        if len(sizes) == 1 or self.batch_size % step == 0:
            self.per_worker_batch(sizes[0])
            return
        micro = max(self.microbatch, 1)
        bad = [n for n in sizes if self.batch_size % n or (self.batch_size // n) % micro]
        works = -(-self.batch_size // step) * step
        per_micro = f" with microbatch={self.microbatch}" if self.microbatch > 0 else ""
        raise invalid(
            "train",
            "batch_size",
            self.batch_size,
            f"must split evenly over every worker count of scaling.num_workers "
            f"{sizes[0]}-{sizes[-1]}{per_micro}: {', '.join(map(str, bad))} workers cannot "
            f"take it; batch_size={works} splits over all of them",
        )
