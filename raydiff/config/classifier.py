"""The classifier section: guided-diffusion's noisy-image classifier (``train.task=classifier``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from raydiff.config.field_values import channel_mult_of, invalid, parse_int_list
from raydiff.config.model import CHANNEL_MULT_BY_IMAGE_SIZE

ClassifierPool = Literal["adaptive", "attention", "spatial", "spatial_v2"]

# guided-diffusion's create_classifier: the model's channel multipliers, from 64 pixels up.
CLASSIFIER_CHANNEL_MULT_BY_IMAGE_SIZE = {
    size: mult for size, mult in CHANNEL_MULT_BY_IMAGE_SIZE.items() if size >= 64
}


@dataclass(kw_only=True, frozen=True)
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


CLASSIFIER_ARGUMENT_FIELDS = {
    "model_channels": "classifier_width",
    "num_res_blocks": "classifier_depth",
    "attention_resolutions": "classifier_attention_resolutions",
    "channel_mult": "classifier_channel_mult",
    "num_head_channels": "classifier_num_head_channels",
}
"""The ClassifierConfig field behind each EncoderUNetModel argument the UNet checks cover."""
