"""Classifier guidance: a guided-diffusion noisy-image classifier and the ``cond_fn`` it gives.

ADM (Dhariwal & Nichol 2021, alg. 1) shifts each reverse step's mean by
``s * Sigma * grad_x log p_phi(y | x_t, t)``; the core does the shift
(``GaussianDiffusion.condition_mean``, and ``condition_score`` for DDIM, alg. 2) given a
``cond_fn(x_t, t, y)`` that returns ``s * grad_x log p_phi(y | x_t, t)``. The classifier is
guided-diffusion's ``EncoderUNetModel`` built from its ``classifier_*`` flags, so the published
``64x64_classifier.pt`` etc. load with the flags they were trained with. No Ray here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

from raydiff.config import from_dict
from raydiff.core.unet import EncoderUNetModel
from raydiff.errors import UserInputError
from raydiff.train.checkpoint import load_model_weights

# guided-diffusion's create_classifier: channel multipliers by resolution.
_CHANNEL_MULT_BY_SIZE = {
    512: "0.5,1,1,2,2,4,4",
    256: "1,1,2,2,4,4",
    128: "1,1,2,3,4",
    64: "1,2,3,4",
}


@dataclass(kw_only=True)
class ClassifierConfig:
    """guided-diffusion's classifier flags (``classifier_defaults()``; same names and defaults)."""

    image_size: int
    """Side of the images (default: the diffusion model's)."""
    in_channels: int = 3
    """Image channels (default: the diffusion model's; guided-diffusion's are RGB)."""
    num_classes: int = 1000
    """Classifier outputs (default: the diffusion model's classes; guided-diffusion: 1000)."""
    classifier_width: int = 128
    classifier_depth: int = 2
    classifier_attention_resolutions: str = "32,16,8"
    classifier_use_scale_shift_norm: bool = True
    classifier_resblock_updown: bool = True
    classifier_pool: Literal["adaptive", "attention", "spatial", "spatial_v2"] = "attention"
    classifier_use_fp16: bool = False
    classifier_channel_mult: str = ""
    """Empty: guided-diffusion's multipliers for 64/128/256/512 pixels (other sizes must set it)."""
    classifier_num_head_channels: int = 64
    """Channels per attention head (guided-diffusion fixes 64)."""

    def __post_init__(self) -> None:
        if not self.classifier_channel_mult and self.image_size not in _CHANNEL_MULT_BY_SIZE:
            raise UserInputError(
                f"classifier at image_size {self.image_size}: guided-diffusion defines channel "
                f"multipliers for {sorted(_CHANNEL_MULT_BY_SIZE)} only; add "
                f"--classifier_channel_mult (e.g. 1,2,2) to --classifier-flags"
            )

    def channel_mult(self) -> tuple[float, ...]:
        text = self.classifier_channel_mult or _CHANNEL_MULT_BY_SIZE[self.image_size]
        return tuple(float(m) if "." in m else int(m) for m in text.split(","))

    def attention_downsample_rates(self) -> tuple[int, ...]:
        """Resolutions -> downsample rates, as create_classifier does (``image_size // res``)."""
        resolutions = [r for r in self.classifier_attention_resolutions.split(",") if r.strip()]
        return tuple(self.image_size // int(r) for r in resolutions)


def classifier_config_from_flags(
    flags: dict[str, str], *, image_size: int, in_channels: int, num_classes: int
) -> ClassifierConfig:
    """The classifier's config from its flags; unset sizes follow the diffusion model's."""
    data: dict[str, Any] = {
        "image_size": image_size,
        "in_channels": in_channels,
        "num_classes": num_classes,
    }
    data.update(flags)
    return from_dict(ClassifierConfig, data, path="--classifier-flags")


def create_classifier(config: ClassifierConfig) -> EncoderUNetModel:
    """guided-diffusion's ``create_classifier`` from typed flags."""
    return EncoderUNetModel(
        image_size=config.image_size,
        in_channels=config.in_channels,
        model_channels=config.classifier_width,
        out_channels=config.num_classes,
        num_res_blocks=config.classifier_depth,
        attention_resolutions=config.attention_downsample_rates(),
        channel_mult=config.channel_mult(),
        use_fp16=config.classifier_use_fp16,
        num_head_channels=config.classifier_num_head_channels,
        use_scale_shift_norm=config.classifier_use_scale_shift_norm,
        resblock_updown=config.classifier_resblock_updown,
        pool=config.classifier_pool,
    )


def load_classifier(path: str | Path, config: ClassifierConfig) -> EncoderUNetModel:
    """The classifier at ``path`` (a guided-diffusion state dict), in eval mode on the CPU.
    Flags that do not match the file's keys are a one-line error listing the differences."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--classifier {str(path)!r} does not exist")
    classifier = create_classifier(config)
    load_model_weights(classifier, path)
    return classifier.eval()


CondFn = Callable[..., torch.Tensor]


def classifier_cond_fn(classifier: torch.nn.Module, *, scale: float) -> CondFn:
    """``cond_fn(x_t, t, y)`` = ``scale * grad_x log p(y | x_t, t)`` (ADM eq. 10's gradient).

    ``t`` arrives in the classifier's (original) timesteps: a respaced diffusion maps them first.
    """

    def cond_fn(x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        if y is None:
            raise ValueError("classifier guidance needs class labels y")
        with torch.enable_grad():
            x_in = x.detach().requires_grad_(True)
            log_probs = F.log_softmax(classifier(x_in, t).float(), dim=-1)
            selected = log_probs[torch.arange(len(y), device=y.device), y.view(-1)]
            return torch.autograd.grad(selected.sum(), x_in)[0] * scale

    return cond_fn
