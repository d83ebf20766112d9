"""What ``raydiff sample`` is asked for, checked before anything starts. No Ray here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from raydiff.config import DiffusionConfig, ExperimentConfig
from raydiff.errors import UserInputError


@dataclass(kw_only=True)
class SampleOptions:
    """What ``raydiff sample`` was asked for (validated on construction)."""

    checkpoint: str
    """A raydiff checkpoint_NNNNNN folder or a published .pt state dict (a path or a URI)."""
    num_samples: int
    """Images to generate."""
    out: str
    """Folder for the npz, the PNGs and the grid (new or empty; a local path or a URI)."""
    weights: str | None = None
    """raydiff checkpoints: ``model`` or ``ema_RATE`` (default: the first EMA rate)."""
    model_flags: str | None = None
    """A published .pt's flags in improved-diffusion's syntax."""
    config_file: str | None = None
    """Or a training config describing a published .pt's model."""
    timestep_respacing: str = ""
    """Sample on these steps ('250', 'ddim50'; default: the model's own)."""
    use_ddim: bool = False
    """DDIM instead of ancestral sampling."""
    eta: float = 0.0
    """DDIM's eta (0: deterministic given the starting noise)."""
    clip_denoised: bool = True
    """Clip the predicted x_0 to [-1, 1] at every step."""
    class_labels: tuple[int, ...] = ()
    """Class-conditional models: labels in turn (default: drawn from the seed)."""
    batch_size: int = 16
    """Samples per batch (the unit of work a worker takes)."""
    num_workers: int = 1
    """Ray sampler actors."""
    use_gpu: bool = False
    """One GPU per worker."""
    seed: int = 0
    """Sample i depends only on (seed, i)."""
    classifier: str | None = None
    """A guided-diffusion classifier .pt for classifier guidance."""
    classifier_flags: str | None = None
    """Its ``classifier_*`` flags in guided-diffusion's syntax (default: its defaults)."""
    classifier_scale: float = 1.0
    """Guidance scale s: the gradient of log p(y | x_t) is multiplied by it."""

    def __post_init__(self) -> None:
        for name in ("num_samples", "batch_size", "num_workers"):
            if getattr(self, name) < 1:
                raise UserInputError(
                    f"--{name.replace('_', '-')} {getattr(self, name)} is invalid: must be >= 1"
                )
        if self.eta < 0:
            raise UserInputError(f"--eta {self.eta} is invalid: must be >= 0")
        if self.eta and not self.use_ddim:
            raise UserInputError("--eta applies to DDIM sampling: add --use-ddim")
        if not self.classifier and (self.classifier_flags or self.classifier_scale != 1.0):
            raise UserInputError(
                "--classifier-flags / --classifier-scale apply to classifier guidance: add "
                "--classifier PATH"
            )
        if self.classifier_scale < 0:
            raise UserInputError(
                f"--classifier-scale {self.classifier_scale} is invalid: must be >= 0"
            )
        if self.seed < 0:
            raise UserInputError(f"--seed {self.seed} is invalid: must be >= 0")


def sampling_diffusion_config(config: ExperimentConfig, options: SampleOptions) -> DiffusionConfig:
    """The model's diffusion, respaced as asked (``--timestep-respacing 250`` / ``ddim50``)."""
    respacing = options.timestep_respacing or config.diffusion.timestep_respacing
    return dataclasses.replace(config.diffusion, timestep_respacing=respacing)
