"""What ``raydiff sample`` is asked for, checked before anything starts. No Ray here.

Each field with a flag is an option of the command (:func:`raydiff.flags.flag`): its help says
what the field means. A value refused here is a ``ConfigError`` of the field, which the command
line shows under the flag the user typed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, get_args

from raydiff.config import CompileMode, DiffusionConfig, ExperimentConfig, Precision
from raydiff.errors import ConfigError, UserInputError
from raydiff.flags import flag


@dataclass(kw_only=True)
class ModelSource:
    """The model a command loads (``raydiff sample``, ``raydiff evaluate bpd``): a raydiff
    checkpoint and its weights, or a published .pt with its flags."""

    checkpoint: str = flag(
        "--checkpoint",
        help="a raydiff checkpoint_NNNNNN folder, or a published improved-/guided-diffusion .pt "
        "(with --model-flags or --config); a local path or a URI",
    )
    weights: str | None = flag(
        "--weights",
        default=None,
        help="raydiff checkpoints: 'model', 'ema_RATE' or 'phema_LENGTH' (raydiff ema's; "
        "default: the first EMA rate)",
    )
    model_flags: str | None = flag(
        "--model-flags",
        default=None,
        help="a .pt's model and diffusion flags in improved-diffusion's syntax, e.g. "
        '"--image_size 64 --num_channels 128 --learn_sigma True"',
    )
    config_file: str | None = flag(
        "--config", default=None, help="or a training config file describing a .pt's model"
    )


def _class_labels(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(c) for c in text.split(",") if c.strip())
    except ValueError:
        raise ValueError("expected integers like '1,5'") from None


@dataclass(kw_only=True)
class SampleOptions(ModelSource):
    """What ``raydiff sample`` was asked for (validated on construction)."""

    section: ClassVar[str] = "sample"
    """What a ``ConfigError`` of these options names as its section."""

    num_samples: int = flag("--num-samples", help="images to generate")
    out: str = flag("--out", help="output folder, new or empty: a local path or a URI (s3://...)")
    timestep_respacing: str = flag(
        "--timestep-respacing",
        default="",
        help="sample on these steps: '250', 'ddim50', '10,15,20' (default: all of the model's)",
    )
    use_ddim: bool = flag("--use-ddim", default=False, help="DDIM instead of ancestral sampling")
    eta: float = flag(
        "--eta", default=0.0, help="DDIM eta (0: deterministic given the starting noise)"
    )
    clip_denoised: bool = flag(
        "--clip-denoised",
        default=True,
        help="clip the predicted x_0 to [-1, 1] at every step (default: on)",
    )
    class_labels: tuple[int, ...] = flag(
        "--class-labels",
        default=(),
        from_arg=_class_labels,
        arg_default="",
        help="class-conditional models: labels used in turn, e.g. '1,5' (default: random per "
        "sample, from the seed)",
    )
    batch_size: int = flag(
        "--batch-size",
        default=16,
        help="samples per batch, the unit of work a worker takes; 0: the largest power of two "
        "(up to 1024 and a worker's share) whose sampling step fits each GPU, 16 on a CPU "
        "(default: %(default)s)",
    )
    num_workers: int = flag(
        "--num-workers", default=1, help="Ray sampler actors (default: %(default)s)"
    )
    use_gpu: bool = flag("--use-gpu", default=False, help="one GPU per worker")
    compile: CompileMode = flag(
        "--compile",
        default="auto",
        help="torch.compile the model for the sampling loop: true, false, or auto (on a GPU); "
        "the samples stay those of (seed, index) (default: %(default)s)",
    )
    precision: Precision = flag(
        "--precision",
        default="auto",
        help="the model's forward in the sampling loop: fp32, or bf16 / fp16 autocast (the "
        "diffusion's arithmetic and a classifier's gradient stay fp32); auto: fp32 on a CPU, on "
        "a GPU bf16 where it has it, else fp16. fp16 needs --use-gpu. The samples stay those of "
        "(seed, index) for one precision (default: %(default)s)",
    )
    seed: int = flag(
        "--seed", default=0, help="sample i depends only on (seed, i) (default: %(default)s)"
    )
    classifier: str | None = flag(
        "--classifier",
        default=None,
        help="classifier guidance: a noisy classifier, a `raydiff train-classifier` checkpoint "
        "folder (RUN/checkpoint_N) or a published guided-diffusion classifier .pt",
    )
    classifier_flags: str | None = flag(
        "--classifier-flags",
        default=None,
        help="a published classifier's flags in guided-diffusion's syntax, e.g. "
        "'--classifier_width 128 --classifier_depth 2 --classifier_attention_resolutions "
        "32,16,8' (default: guided-diffusion's defaults; image size and classes follow the "
        "model)",
    )
    classifier_weights: str | None = flag(
        "--classifier-weights",
        default=None,
        help="a raydiff classifier checkpoint's weights: 'model', 'ema_RATE' or 'phema_LENGTH' "
        "(raydiff ema's; default: its first EMA rate, else its model)",
    )
    classifier_scale: float = flag(
        "--classifier-scale",
        default=1.0,
        help="guidance scale s: multiplies grad log p(y | x_t) (default: %(default)s)",
    )
    upsampler: str | None = flag(
        "--upsampler",
        default=None,
        help="a cascade: upsample the samples with this upsampler (a train.task=super_res "
        "checkpoint folder, or a published .pt with --upsampler-config); each stage's npz, PNGs "
        "and grid go to OUT/base and OUT/upsampled",
    )
    upsampler_weights: str | None = flag(
        "--upsampler-weights",
        default=None,
        help="the upsampler checkpoint's 'model' or 'ema_RATE' (default: its first EMA rate)",
    )
    upsampler_config: str | None = flag(
        "--upsampler-config",
        default=None,
        help="a published upsampler .pt's config: a preset (upsampler_imagenet64_256) or file",
    )
    upsampler_respacing: str = flag(
        "--upsampler-respacing",
        default="",
        help="the upsampler's steps: '250', 'ddim25' (default: all of its own)",
    )
    upsampler_use_ddim: bool = flag(
        "--upsampler-use-ddim", default=False, help="DDIM for the upsampling stage"
    )
    low_res: str | None = flag(
        "--low-res",
        default=None,
        help="upsamplers (train.task=super_res): the low-resolution images to upsample, a "
        "samples_*.npz (arr_0 uint8 [N, h, w, C] at super_res.small_size; arr_1 its labels) or "
        "a `raydiff sample` folder; sample i upsamples image i %% N",
    )

    def __post_init__(self) -> None:
        for name in ("num_samples", "num_workers"):
            if getattr(self, name) < 1:
                raise self._invalid(name, "must be >= 1")
        if self.batch_size < 0:
            raise self._invalid("batch_size", "must be >= 1, or 0 for the largest that fits")
        if self.eta < 0:
            raise self._invalid("eta", "must be >= 0")
        if self.eta and not self.use_ddim:
            raise UserInputError("--eta applies to DDIM sampling: add --use-ddim")
        guidance_options = (self.classifier_flags, self.classifier_weights)
        if not self.classifier and (any(guidance_options) or self.classifier_scale != 1.0):
            raise UserInputError(
                "--classifier-flags / --classifier-weights / --classifier-scale apply to "
                "classifier guidance: add --classifier PATH"
            )
        upsampler_options = (
            self.upsampler_weights,
            self.upsampler_config,
            self.upsampler_respacing,
            self.upsampler_use_ddim,
        )
        if not self.upsampler and any(upsampler_options):
            raise UserInputError(
                "--upsampler-weights / --upsampler-config / --upsampler-respacing / "
                "--upsampler-use-ddim apply to a cascade: add --upsampler PATH"
            )
        if self.upsampler and self.low_res:
            raise UserInputError(
                "--upsampler upsamples the base model's samples; --low-res gives an upsampler "
                "images of your own: one of them"
            )
        if self.low_res and (self.classifier or self.class_labels):
            raise UserInputError(
                "--low-res conditions an upsampler on those images (their labels in arr_1): "
                "--classifier and --class-labels apply to a base model"
            )
        if self.classifier_scale < 0:
            raise self._invalid("classifier_scale", "must be >= 0")
        if self.seed < 0:
            raise self._invalid("seed", "must be >= 0")
        self._check_precision()

    def _check_precision(self) -> None:
        valid = get_args(Precision)
        if self.precision not in valid:
            raise self._invalid("precision", f"valid: {', '.join(valid)}")
        if self.precision == "fp16" and not self.use_gpu:
            # CPU autocast to fp16 works, but the demo model's forward ran 34x slower than fp32.
            raise self._invalid(
                "precision",
                "fp16 autocast needs --use-gpu: CPUs have no fast fp16 kernels (use bf16 or fp32 "
                "on a CPU)",
            )

    def _invalid(self, name: str, reason: str) -> ConfigError:
        return ConfigError(
            section=self.section, field=name, value=getattr(self, name), reason=reason
        )


def cascade_stages(options: SampleOptions) -> tuple[SampleOptions, SampleOptions]:
    """The two ``raydiff sample`` runs of a cascade (``--upsampler``): the base model's samples
    into ``OUT/base``, then the upsampler on them (their labels too) into ``OUT/upsampled``,
    each with its own steps; the seed, batch, workers and devices are shared."""
    out = options.out.rstrip("/")
    base = dataclasses.replace(
        options,
        out=f"{out}/base",
        upsampler=None,
        upsampler_weights=None,
        upsampler_config=None,
        upsampler_respacing="",
        upsampler_use_ddim=False,
    )
    assert options.upsampler is not None
    upsampled = SampleOptions(
        checkpoint=options.upsampler,
        weights=options.upsampler_weights,
        config_file=options.upsampler_config,
        num_samples=options.num_samples,
        out=f"{out}/upsampled",
        timestep_respacing=options.upsampler_respacing,
        use_ddim=options.upsampler_use_ddim,
        clip_denoised=options.clip_denoised,
        batch_size=options.batch_size,
        num_workers=options.num_workers,
        use_gpu=options.use_gpu,
        compile=options.compile,
        precision=options.precision,
        seed=options.seed,
        low_res=base.out,
    )
    return base, upsampled


def sampling_diffusion_config(config: ExperimentConfig, options: SampleOptions) -> DiffusionConfig:
    """The model's diffusion, respaced as asked (``--timestep-respacing 250`` / ``ddim50``)."""
    respacing = options.timestep_respacing or config.diffusion.timestep_respacing
    return dataclasses.replace(config.diffusion, timestep_respacing=respacing)
