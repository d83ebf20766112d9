"""What ``raydiff evaluate bpd`` is asked for, checked before anything starts. No Ray here."""

from __future__ import annotations

from dataclasses import dataclass

from raydiff.errors import UserInputError


@dataclass(kw_only=True)
class BpdOptions:
    """What ``raydiff evaluate bpd`` was asked for (validated on construction)."""

    checkpoint: str
    """A raydiff checkpoint_NNNNNN folder or a published .pt state dict."""
    weights: str | None = None
    """raydiff checkpoints: ``model`` or ``ema_RATE`` (default: the first EMA rate)."""
    model_flags: str | None = None
    """A published .pt's flags in improved-diffusion's syntax."""
    config_file: str | None = None
    """Or a training config describing a published .pt's model."""
    data: str | None = None
    """The prepared dataset (default: the one the checkpoint was trained on)."""
    split: str = "test"
    """The split whose images are evaluated."""
    num_images: int | None = None
    """Evaluate the split's first N images (default: all of them)."""
    timestep_respacing: str = ""
    """The bound of a respaced chain ('100'): fewer model calls, a looser bound."""
    clip_denoised: bool = True
    """Clip the predicted x_0 to [-1, 1] in each term (improved-diffusion's default)."""
    batch_size: int = 32
    """Images per batch (the unit of work a worker takes)."""
    num_workers: int = 1
    """Ray actors, one CPU (one thread) or one GPU each."""
    use_gpu: bool = False
    seed: int = 0
    """Image i's noise depends only on (seed, i)."""
    out: str | None = None
    """Folder for the results (default: RUN/evaluation/checkpoint_NNNNNN for a run's checkpoint)."""

    def __post_init__(self) -> None:
        for name in ("batch_size", "num_workers"):
            if getattr(self, name) < 1:
                raise UserInputError(
                    f"--{name.replace('_', '-')} {getattr(self, name)} is invalid: must be >= 1"
                )
        if self.num_images is not None and self.num_images < 1:
            raise UserInputError(
                f"--num-images {self.num_images} is invalid: must be >= 1 (or leave it out for "
                f"the whole split)"
            )
        if self.seed < 0:
            raise UserInputError(f"--seed {self.seed} is invalid: must be >= 0")
