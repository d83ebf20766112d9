"""The model section: improved-/guided-diffusion's UNet flags."""

from __future__ import annotations

from dataclasses import dataclass

from raydiff.config.field_values import channel_mult_of, invalid, parse_int_list

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


@dataclass(kw_only=True, frozen=True)
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
            # The ModelConfig field behind the UNetModel argument (most have its name).
            name = {"model_channels": "num_channels", "out_channels": "in_channels"}.get(
                err.argument, err.argument
            )
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
