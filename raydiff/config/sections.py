"""The sections of an experiment config: model, classifier, diffusion, optim, train, scaling,
evaluation.

Each section is a ``@dataclass(kw_only=True)`` that validates itself on construction and raises a
:class:`~raydiff.errors.ConfigError` naming the field, the bad value and what would be valid. A
section checks only its own fields; what relates two sections is checked (and derived) by
:class:`~raydiff.config.experiment.ExperimentConfig`. The data section lives with the data
pipeline (:mod:`raydiff.data.config`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal, get_args

from raydiff.errors import ConfigError

NoiseSchedule = Literal["linear", "cosine"]

# improved-diffusion's / guided-diffusion's image_size -> channel_mult table.
CHANNEL_MULT_BY_IMAGE_SIZE: dict[int, tuple[float, ...]] = {
    32: (1, 2, 2, 2),
    64: (1, 2, 3, 4),
    128: (1, 1, 2, 3, 4),
    256: (1, 1, 2, 2, 4, 4),
    512: (0.5, 1, 1, 2, 2, 4, 4),
}

UPSAMPLER_CHANNEL_MULT_BY_IMAGE_SIZE = {**CHANNEL_MULT_BY_IMAGE_SIZE, 512: (1, 1, 2, 2, 4, 4)}
"""guided-diffusion's ``sr_create_model`` table (by ``large_size``): the base table's but at 512."""


def invalid(section: str, name: str, value: Any, reason: str) -> ConfigError:
    """The error for ``section.name=value``, saying why it is invalid and what would be valid."""
    return ConfigError(section=section, field=name, value=value, reason=reason)


def parse_int_list(text: str, *, section: str, name: str) -> tuple[int, ...]:
    """Parse ``"16,8"`` into ``(16, 8)``; an empty string gives ``()``."""
    if text.strip() == "":
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise invalid(
            section, name, text, "expected comma-separated integers like '16,8'"
        ) from None


def channel_mult_of(
    text: str,
    *,
    image_size: int,
    table: dict[int, tuple[float, ...]],
    section: str,
    name: str,
) -> tuple[float, ...]:
    """Comma-separated multipliers (``"1,2,2"``), or ``table``'s entry for ``image_size`` when
    ``text`` is empty; errors name ``section.name``."""
    if text.strip():
        try:
            mult = tuple(float(m) for m in text.split(","))
        except ValueError:
            mult = ()
        if not mult or any(m <= 0 for m in mult):
            raise invalid(section, name, text, "expected positive numbers like '1,2,2,2'")
        return tuple(int(m) if m == int(m) else m for m in mult)
    if image_size not in table:
        sizes = ", ".join(str(k) for k in table)
        raise invalid(
            section,
            name,
            text,
            f"no default for image_size {image_size} (the table has {sizes}); set {name} "
            "explicitly, e.g. '1,2,2'",
        )
    return table[image_size]


@dataclass(kw_only=True)
class ModelConfig:
    """The UNet (improved-/guided-diffusion's model flags)."""

    image_size: int = 64
    """Side of the square images in pixels."""
    in_channels: int = 3
    """Image channels: 3 for RGB, 1 for greyscale."""
    num_channels: int = 128
    """Base channel count of the UNet (model_channels); multiplied by channel_mult per level."""
    num_res_blocks: int = 2
    """Residual blocks per resolution level."""
    channel_mult: str = ""
    """Comma-separated multipliers per level, e.g. '1,2,2,2'; '' takes the image_size table."""
    attention_resolutions: str = "16,8"
    """Comma-separated resolutions (in pixels) at which self-attention is applied."""
    num_heads: int = 4
    """Attention heads (ignored where num_head_channels is set)."""
    num_head_channels: int = -1
    """Channels per attention head; -1 uses num_heads instead."""
    num_heads_upsample: int = -1
    """Heads in the decoder's attention; -1 means num_heads."""
    dropout: float = 0.0
    """Dropout probability inside the residual blocks."""
    class_cond: bool = False
    """Condition on class labels (y)."""
    num_classes: int = 1000
    """Number of classes when class_cond is set."""
    use_checkpoint: bool = False
    """Gradient checkpointing: less memory, about 30% more compute."""
    use_scale_shift_norm: bool = True
    """FiLM-like conditioning of the normalisation on the timestep embedding."""
    resblock_updown: bool = False
    """Use residual blocks for up/down-sampling (guided-diffusion / BigGAN style)."""
    use_fp16: bool = False
    """improved-/guided-diffusion's --use_fp16: train in fp16 with dynamic loss scaling. raydiff
    does that with autocast and fp32 master weights: it means train.precision=fp16 (set for you
    when precision is left at fp32; contradicting it with bf16 is an error)."""
    use_new_attention_order: bool = False
    """guided-diffusion's split-then-reshape QKV layout."""

    def __post_init__(self) -> None:
        s = "model"
        if self.image_size < 1:
            raise invalid(s, "image_size", self.image_size, "must be a positive integer")
        if self.in_channels < 1:
            raise invalid(s, "in_channels", self.in_channels, "must be >= 1 (1 grey, 3 RGB)")
        if self.num_channels < 1:
            raise invalid(s, "num_channels", self.num_channels, "must be a positive integer")
        if self.num_res_blocks < 1:
            raise invalid(s, "num_res_blocks", self.num_res_blocks, "must be >= 1")
        if not 0.0 <= self.dropout < 1.0:
            raise invalid(s, "dropout", self.dropout, "must lie in [0, 1)")
        if self.class_cond and self.num_classes < 1:
            raise invalid(s, "num_classes", self.num_classes, "must be >= 1 with class_cond")
        self._check_architecture()

    def _check_architecture(self) -> None:
        """The UNet's own architecture checks (GroupNorm, image_size, attention, heads), with
        errors naming this config's fields."""
        from raydiff.core.unet_arguments import UNetArgumentError, check_unet_architecture

        mult = self.channel_mult_tuple()
        pixels = self.attention_resolution_tuple()
        rates = self._attention_rates(pixels)
        try:
            check_unet_architecture(
                image_size=self.image_size,
                in_channels=self.in_channels,
                model_channels=self.num_channels,
                out_channels=self.in_channels,  # learn_sigma doubles it, which changes nothing here
                num_res_blocks=self.num_res_blocks,
                attention_resolutions=rates,
                dropout=self.dropout,
                channel_mult=mult,
                num_heads=self.num_heads,
                num_head_channels=self.num_head_channels,
                num_heads_upsample=self.num_heads_upsample,
            )
        except UNetArgumentError as err:
            name = UNET_ARGUMENT_FIELDS[err.argument]
            reason = err.reason
            if err.argument == "attention_resolutions":  # the UNet speaks in downsample rates
                resolutions = [self.image_size // 2**level for level in range(len(mult))]
                bad = pixels[rates.index(err.item)]
                reason = f"{bad} is not a resolution of this UNet; valid: {resolutions}"
            raise invalid("model", name, getattr(self, name), reason) from None

    def channel_mult_tuple(self, *, upsampler: bool = False) -> tuple[float, ...]:
        """The explicit channel_mult, or the image_size table's entry (an upsampler's table,
        guided-diffusion's ``sr_create_model``'s, with ``upsampler``)."""
        return channel_mult_of(
            self.channel_mult,
            image_size=self.image_size,
            table=UPSAMPLER_CHANNEL_MULT_BY_IMAGE_SIZE if upsampler else CHANNEL_MULT_BY_IMAGE_SIZE,
            section="model",
            name="channel_mult",
        )

    def attention_resolution_tuple(self) -> tuple[int, ...]:
        """attention_resolutions as integers (pixels)."""
        return parse_int_list(
            self.attention_resolutions, section="model", name="attention_resolutions"
        )

    def attention_downsample_rates(self) -> tuple[int, ...]:
        """Attention resolutions as the UNet's downsample rates (image_size // resolution)."""
        return self._attention_rates(self.attention_resolution_tuple())

    def _attention_rates(self, resolutions: tuple[int, ...]) -> tuple[int, ...]:
        # A resolution that does not divide image_size has no rate: 0, which no UNet accepts.
        return tuple(
            self.image_size // res if res > 0 and self.image_size % res == 0 else 0
            for res in resolutions
        )


UNET_ARGUMENT_FIELDS = {
    "image_size": "image_size",
    "in_channels": "in_channels",
    "model_channels": "num_channels",
    "out_channels": "in_channels",
    "num_res_blocks": "num_res_blocks",
    "attention_resolutions": "attention_resolutions",
    "dropout": "dropout",
    "channel_mult": "channel_mult",
    "num_heads": "num_heads",
    "num_head_channels": "num_head_channels",
    "num_heads_upsample": "num_heads_upsample",
}
"""The ModelConfig field behind each UNetModel argument that ``check_unet_architecture`` checks."""


ClassifierPool = Literal["adaptive", "attention", "spatial", "spatial_v2"]

# guided-diffusion's create_classifier: channel multipliers by image size.
CLASSIFIER_CHANNEL_MULT_BY_IMAGE_SIZE: dict[int, tuple[float, ...]] = {
    64: (1, 2, 3, 4),
    128: (1, 1, 2, 3, 4),
    256: (1, 1, 2, 2, 4, 4),
    512: (0.5, 1, 1, 2, 2, 4, 4),
}


@dataclass(kw_only=True)
class ClassifierConfig:
    """guided-diffusion's noisy-image classifier (``EncoderUNetModel``, its ``classifier_*`` flags
    and defaults) and how ``train.task=classifier`` trains it. Its image size, channels and class
    count are the model section's (``image_size``, ``in_channels``, ``num_classes``)."""

    classifier_width: int = 128
    """Base channel count of the classifier."""
    classifier_depth: int = 2
    """Residual blocks per resolution level."""
    classifier_attention_resolutions: str = "32,16,8"
    """Comma-separated resolutions (in pixels) with self-attention."""
    classifier_use_scale_shift_norm: bool = True
    """FiLM-like conditioning of the normalisation on the timestep embedding."""
    classifier_resblock_updown: bool = True
    """Residual blocks for downsampling."""
    classifier_pool: ClassifierPool = "attention"
    """The head: attention, adaptive (average), spatial or spatial_v2."""
    classifier_use_fp16: bool = False
    """guided-diffusion's fp16 classifier: means train.precision=fp16 when training one."""
    classifier_channel_mult: str = ""
    """Comma-separated multipliers per level; '' takes guided-diffusion's table (64, 128, 256,
    512 pixels; other sizes must set it)."""
    classifier_num_head_channels: int = 64
    """Channels per attention head (guided-diffusion fixes 64)."""
    noised: bool = True
    """Train on x_t = q_sample(x_0, t) at uniformly drawn t (a noisy classifier, for guidance);
    false: on the clean images at t = 0 (an evaluator)."""
    random_crop: bool = True
    """guided-diffusion's training crop: each image is resized by a random factor in
    [1, 1.25] (bicubic) and cropped back to its size at a random place."""

    def __post_init__(self) -> None:
        s = "classifier"
        for name in ("classifier_width", "classifier_depth", "classifier_num_head_channels"):
            if getattr(self, name) < 1:
                raise invalid(s, name, getattr(self, name), "must be >= 1")
        if self.classifier_pool not in get_args(ClassifierPool):
            valid = ", ".join(get_args(ClassifierPool))
            raise invalid(s, "classifier_pool", self.classifier_pool, f"valid: {valid}")
        parse_int_list(
            self.classifier_attention_resolutions,
            section=s,
            name="classifier_attention_resolutions",
        )
        if self.classifier_channel_mult.strip():
            self.channel_mult(image_size=0)  # the explicit multipliers parse

    def check_architecture(self, *, image_size: int, in_channels: int, num_classes: int) -> None:
        """The network's own checks (GroupNorm groups, heads, resolutions) for these images,
        with errors naming this section's fields."""
        from raydiff.core.unet_arguments import UNetArgumentError, check_unet_architecture

        try:
            check_unet_architecture(
                image_size=image_size,
                in_channels=in_channels,
                model_channels=self.classifier_width,
                out_channels=num_classes,
                num_res_blocks=self.classifier_depth,
                attention_resolutions=self.attention_downsample_rates(image_size),
                channel_mult=self.channel_mult(image_size),
                num_head_channels=self.classifier_num_head_channels,
            )
        except UNetArgumentError as err:
            name = CLASSIFIER_ARGUMENT_FIELDS.get(err.argument)
            if name is None:  # a model-section value (image size, channels, classes)
                model_field = {"out_channels": "num_classes"}.get(err.argument, err.argument)
                raise invalid("model", model_field, err.value, err.reason) from None
            raise invalid("classifier", name, getattr(self, name), err.reason) from None

    def channel_mult(self, image_size: int) -> tuple[float, ...]:
        """The explicit multipliers, or guided-diffusion's for ``image_size`` (64, 128, 256,
        512 pixels)."""
        return channel_mult_of(
            self.classifier_channel_mult,
            image_size=image_size,
            table=CLASSIFIER_CHANNEL_MULT_BY_IMAGE_SIZE,
            section="classifier",
            name="classifier_channel_mult",
        )

    def attention_downsample_rates(self, image_size: int) -> tuple[int, ...]:
        """Attention resolutions as downsample rates (``image_size // res``, as guided-diffusion's
        ``create_classifier``); each must divide ``image_size``."""
        resolutions = parse_int_list(
            self.classifier_attention_resolutions,
            section="classifier",
            name="classifier_attention_resolutions",
        )
        for res in resolutions:
            if not (0 < res <= image_size and image_size % res == 0):
                raise invalid(
                    "classifier",
                    "classifier_attention_resolutions",
                    self.classifier_attention_resolutions,
                    f"{res} does not divide image_size {image_size}",
                )
        return tuple(image_size // res for res in resolutions)


@dataclass(kw_only=True)
class SuperResConfig:
    """improved-diffusion's super-resolution model (``super_res_train.py``): the model section's
    UNet at ``model.image_size`` (its ``--large_size``), conditioned on the image shrunk to
    ``small_size`` (``F.interpolate(mode="area")`` of the batch), when ``train.task`` is
    'super_res'."""

    small_size: int = 64
    """Side of the low-resolution input in pixels (improved-diffusion's ``--small_size``)."""

    def __post_init__(self) -> None:
        if self.small_size < 1:
            raise invalid("super_res", "small_size", self.small_size, "must be >= 1")


CLASSIFIER_ARGUMENT_FIELDS = {
    "model_channels": "classifier_width",
    "num_res_blocks": "classifier_depth",
    "attention_resolutions": "classifier_attention_resolutions",
    "channel_mult": "classifier_channel_mult",
    "num_head_channels": "classifier_num_head_channels",
}
"""The ClassifierConfig field behind each EncoderUNetModel argument the UNet checks cover."""


@dataclass(kw_only=True)
class DiffusionConfig:
    """The diffusion process and objective (improved-diffusion's diffusion flags and defaults)."""

    diffusion_steps: int = 1000
    """T, the number of diffusion steps the model is trained with."""
    noise_schedule: NoiseSchedule = "linear"
    """Beta schedule: 'linear' (DDPM) or 'cosine' (IDDPM eq. 17)."""
    timestep_respacing: str = ""
    """Steps to sample with: '' (all), a count '250', sections '10,15,20' or 'ddimN'."""
    learn_sigma: bool = False
    """Learn the variance (LEARNED_RANGE, IDDPM eq. 15); the model outputs 2x channels."""
    sigma_small: bool = False
    """With a fixed variance, use beta~_t (FIXED_SMALL) instead of beta_t (FIXED_LARGE)."""
    use_kl: bool = False
    """Train on the variational bound L_vlb (RESCALED_KL) instead of the MSE."""
    predict_xstart: bool = False
    """Predict x_0 instead of epsilon."""
    rescale_timesteps: bool = True
    """Feed the model t scaled to [0, 1000) whatever T is (improved-diffusion's default)."""
    rescale_learned_sigmas: bool = True
    """With learn_sigma, weight the VB term by T/1000: L_hybrid (RESCALED_MSE)."""

    def __post_init__(self) -> None:
        s = "diffusion"
        # A chain of one step has no posterior variance to extend (improved-diffusion's
        # GaussianDiffusion indexes posterior_variance[1]): 2 steps at least, respaced too.
        if self.diffusion_steps < 2:
            raise invalid(s, "diffusion_steps", self.diffusion_steps, "must be >= 2")
        valid = get_args(NoiseSchedule)
        if self.noise_schedule not in valid:
            raise invalid(s, "noise_schedule", self.noise_schedule, f"valid: {', '.join(valid)}")
        if self.noise_schedule == "linear" and self.diffusion_steps <= 20:
            # The linear schedule ends at beta_T = 20 / T, which reaches 1 (abar_T = 0) at T = 20.
            raise invalid(
                s,
                "diffusion_steps",
                self.diffusion_steps,
                "the linear schedule needs > 20 steps; use 'cosine' for fewer",
            )
        if self.timestep_respacing:
            from raydiff.core.respace import space_timesteps  # pure torch/NumPy, no cycle at import

            try:
                kept = space_timesteps(self.diffusion_steps, self.timestep_respacing)
            except ValueError as err:
                raise invalid(s, "timestep_respacing", self.timestep_respacing, str(err)) from None
            if len(kept) < 2:
                raise invalid(
                    s, "timestep_respacing", self.timestep_respacing, "must keep >= 2 steps"
                )


Precision = Literal["fp32", "fp16", "bf16", "auto"]
TaskName = Literal["diffusion", "classifier", "super_res"]
ScheduleSamplerName = Literal["uniform", "loss-second-moment"]


@dataclass(kw_only=True)
class OptimConfig:
    """AdamW, learning-rate schedule and EMA (improved-diffusion's TrainLoop flags)."""

    lr: float = 1e-4
    """Peak learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    lr_anneal_steps: int = 0
    """Decay the lr linearly to 0 over this many steps (0: constant lr)."""
    warmup_steps: int = 0
    """Linear lr warm-up from 0 over this many steps."""
    grad_clip: float = 0.0
    """Clip the global gradient norm to this value (0: no clipping)."""
    ema_rate: str = "0.9999"
    """Comma-separated EMA decay rates, e.g. '0.9999,0.999'."""
    adam_betas: str = "0.9,0.999"
    """AdamW betas."""

    def __post_init__(self) -> None:
        s = "optim"
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise invalid(s, "lr", self.lr, "must be a finite number > 0")
        if self.weight_decay < 0:
            raise invalid(s, "weight_decay", self.weight_decay, "must be >= 0")
        for name in ("lr_anneal_steps", "warmup_steps"):
            if getattr(self, name) < 0:
                raise invalid(s, name, getattr(self, name), "must be >= 0")
        if self.grad_clip < 0:
            raise invalid(s, "grad_clip", self.grad_clip, "must be >= 0 (0 turns clipping off)")
        self.ema_rates()
        betas = self.adam_beta_tuple()
        if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise invalid(s, "adam_betas", self.adam_betas, "expected two numbers in [0, 1)")

    def ema_rates(self) -> tuple[float, ...]:
        """The EMA decay rates as floats."""
        if not self.ema_rate.strip():
            return ()
        try:
            rates = tuple(float(r) for r in self.ema_rate.split(","))
        except ValueError:
            raise invalid(
                "optim", "ema_rate", self.ema_rate, "expected numbers like '0.9999,0.999'"
            ) from None
        if not all(0 < r < 1 for r in rates):
            raise invalid("optim", "ema_rate", self.ema_rate, "every rate must lie in (0, 1)")
        return rates

    def adam_beta_tuple(self) -> tuple[float, ...]:
        """The AdamW betas as floats."""
        try:
            return tuple(float(b) for b in self.adam_betas.split(","))
        except ValueError:
            raise invalid("optim", "adam_betas", self.adam_betas, "expected '0.9,0.999'") from None


@dataclass(kw_only=True)
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
        ):
            if getattr(self, name) not in get_args(valid):
                raise invalid(s, name, getattr(self, name), f"valid: {', '.join(get_args(valid))}")
        for name in ("max_steps", "log_interval", "save_interval"):
            if getattr(self, name) < 1:
                raise invalid(s, name, getattr(self, name), "must be >= 1")
        for name in ("sample_interval", "eval_interval"):
            if getattr(self, name) < 0:
                raise invalid(s, name, getattr(self, name), "must be >= 0 (0: only at the end)")
        for name in ("eval_num_images", "eval_timesteps", "sample_count"):
            if getattr(self, name) < 1:
                raise invalid(s, name, getattr(self, name), "must be >= 1")
        if self.sample_steps < 2:  # a one-step chain has no posterior (see DiffusionConfig)
            raise invalid(s, "sample_steps", self.sample_steps, "must be >= 2")
        if self.seed < 0:
            raise invalid(s, "seed", self.seed, "must be >= 0")
        if self.max_consecutive_skipped < 1:
            raise invalid(
                s, "max_consecutive_skipped", self.max_consecutive_skipped, "must be >= 1"
            )
        if not self.initial_loss_scale > 0:
            raise invalid(s, "initial_loss_scale", self.initial_loss_scale, "must be > 0")
        if not self.min_loss_scale > 0:
            raise invalid(s, "min_loss_scale", self.min_loss_scale, "must be > 0")

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


WorkerCount = int | tuple[int, int]
"""``scaling.num_workers``: a fixed number of workers, or ``(min, max)`` for an elastic run."""


def parse_worker_count(value: Any) -> WorkerCount:
    """``2``, ``"2"``, ``"1-4"``, ``[1, 4]`` or ``"[1, 4]"`` (YAML, JSON, ``--set`` and
    ``--num-workers``) -> ``2`` or ``(1, 4)``; ValueError for anything else. A range of one size
    is that size."""
    if isinstance(value, str):
        text = value.strip().strip("[]()").replace(" ", "")
        parts = text.split(",") if "," in text else text.split("-")
        value = parts[0] if len(parts) == 1 else parts
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise ValueError("expected N or MIN-MAX")
        low, high = (_whole(v) for v in value)
        return low if low == high else (low, high)
    return _whole(value)


def _whole(value: Any) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and value % 1):
        raise ValueError("expected N or MIN-MAX")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError("expected N or MIN-MAX") from None


@dataclass(kw_only=True)
class ScalingConfig:
    """How the run is spread over Ray: workers, resources, failure handling."""

    num_workers: WorkerCount = 2
    """Training workers (DDP ranks): N, or MIN-MAX ([MIN, MAX] in YAML) for an elastic run that
    Ray Train resizes between MIN and MAX workers as nodes come and go."""
    use_gpu: bool = False
    """One GPU per worker (NCCL) instead of CPU workers (gloo)."""
    cpus_per_worker: float = 1.0
    """CPUs reserved per worker; leave some CPUs free for Ray Data's decoding."""
    max_failures: int = 3
    """Worker-group restarts from the last checkpoint before the run fails (-1: unlimited)."""
    max_preemption_failures: int = -1
    """Restarts after a preemption (a node drained by its cloud or Kubernetes), counted apart
    from max_failures (-1: unlimited)."""
    preemption_check_interval: int = 1
    """Steps between checks for a preemption notice, on which the run checkpoints at once and
    waits for its restart (a barrier of all workers: ~2-7 ms on a CPU cluster; 0: never)."""
    resize_check_interval_s: float = 60.0
    """Seconds between an elastic run's checks for added capacity (a resize restarts the group
    from its last checkpoint: keep it well above save_interval's time)."""
    checkpoints_to_keep: int = 3
    """Newest checkpoints kept in run storage."""
    sampler_refresh_interval: int = 10
    """Steps between loss-aware sampler weight refreshes (all ranks switch together)."""

    def __post_init__(self) -> None:
        s = "scaling"
        try:
            self.num_workers = parse_worker_count(self.num_workers)
        except ValueError as err:
            raise invalid(s, "num_workers", self.num_workers, str(err)) from None
        if self.min_workers < 1:
            raise invalid(s, "num_workers", self.num_workers, "must be >= 1 (every size)")
        if self.min_workers > self.max_workers:
            raise invalid(
                s,
                "num_workers",
                self.num_workers,
                f"the minimum {self.min_workers} is above the maximum {self.max_workers}",
            )
        if self.cpus_per_worker <= 0:
            raise invalid(s, "cpus_per_worker", self.cpus_per_worker, "must be > 0")
        if self.max_failures < -1:
            raise invalid(s, "max_failures", self.max_failures, "must be >= 0, or -1 for unlimited")
        if self.max_preemption_failures < -1:
            raise invalid(
                s,
                "max_preemption_failures",
                self.max_preemption_failures,
                "must be >= 0, or -1 for unlimited",
            )
        if self.preemption_check_interval < 0:
            raise invalid(
                s,
                "preemption_check_interval",
                self.preemption_check_interval,
                "must be >= 0 (0: never)",
            )
        if self.resize_check_interval_s < 0:
            raise invalid(
                s, "resize_check_interval_s", self.resize_check_interval_s, "must be >= 0"
            )
        if self.checkpoints_to_keep < 1:
            raise invalid(s, "checkpoints_to_keep", self.checkpoints_to_keep, "must be >= 1")
        if self.sampler_refresh_interval < 1:
            raise invalid(
                s, "sampler_refresh_interval", self.sampler_refresh_interval, "must be >= 1"
            )

    @property
    def min_workers(self) -> int:
        """The fewest workers the run trains on (``num_workers`` when it is fixed)."""
        return self.num_workers[0] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def max_workers(self) -> int:
        """The most workers the run trains on: what resources are sized for."""
        return self.num_workers[1] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def worker_sizes(self) -> range:
        """Every size the worker group may have."""
        return range(self.min_workers, self.max_workers + 1)


@dataclass(kw_only=True)
class EvaluationConfig:
    """Evaluation of each new checkpoint while the run trains (``raydiff train
    --evaluate-checkpoints``): one Ray actor of its own, beside the training workers, samples
    from the checkpoint's EMA weights and computes the full bound on val images (FID too, given
    Inception weights). Results: RUN/evaluation/ and ``eval/*`` in the run's TensorBoard."""

    every_checkpoint: bool = False
    """Evaluate every checkpoint the run saves, asynchronously."""
    num_samples: int = 64
    """Samples drawn per checkpoint (a grid in TensorBoard, the npz in RUN/evaluation)."""
    sample_respacing: str = "ddim50"
    """Sampler steps: 'ddimN' (DDIM on N steps), 'N' (ancestral on N steps) or '' (all T)."""
    bpd_images: int = 16
    """Val images whose full bound is computed, T model calls each (0: no bits/dim)."""
    inception: str = ""
    """FID Inception weights file; when set, FID/KID of the samples against the val split."""
    cpus: float = 1.0
    """CPUs reserved for the evaluation actor (on a GPU run it takes one GPU instead)."""

    def __post_init__(self) -> None:
        s = "evaluation"
        if self.num_samples < 1:
            raise invalid(s, "num_samples", self.num_samples, "must be >= 1")
        if self.bpd_images < 0:
            raise invalid(s, "bpd_images", self.bpd_images, "must be >= 0 (0: no bits/dim)")
        if self.cpus <= 0:
            raise invalid(s, "cpus", self.cpus, "must be > 0")

    def sampling_diffusion(self, diffusion: DiffusionConfig) -> DiffusionConfig:
        """The run's diffusion respaced for evaluation samples (checks the respacing)."""
        try:
            return dataclasses.replace(diffusion, timestep_respacing=self.sample_respacing)
        except ConfigError as err:
            raise invalid(
                "evaluation", "sample_respacing", self.sample_respacing, err.reason
            ) from None
