"""The UNet's constructor-argument rules, without torch.

:func:`check_unet_architecture` is the one implementation of what makes a buildable UNet
(``raydiff.core.unet`` checks its arguments with it, ``raydiff.config.ModelConfig`` validates
with it). It lives apart from the modules so that validating a config imports no torch: a
sweep's trial, the CLI's config errors and a Ray Train controller build configs and never a
model.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

__all__ = ["NUM_NORM_GROUPS", "UNetArgumentError", "check_unet_architecture"]

NUM_NORM_GROUPS = 32
"""GroupNorm's group count in every UNet normalisation layer (improved-diffusion's 32)."""


class UNetArgumentError(ValueError):
    """A constructor argument with which no UNet can be built.

    ``argument`` names the constructor argument, ``value`` is its value, ``reason`` says what is
    wrong without naming the argument (so that a caller with its own names for the arguments, such
    as ``ModelConfig``, can say it in its terms) and ``item`` is the offending element of a
    sequence argument (the downsample rate in ``attention_resolutions``), else None.
    """

    def __init__(self, argument: str, value: object, reason: str, item: object = None) -> None:
        super().__init__(argument, value, reason, item)  # args rebuild it (pickling)
        self.argument = argument
        self.value = value
        self.reason = reason
        self.item = item

    def __str__(self) -> str:
        return f"{self.argument}={self.value!r} is invalid: {self.reason}"


def check_unet_architecture(
    *,
    image_size: int | None,
    in_channels: int,
    model_channels: int,
    out_channels: int,
    num_res_blocks: int,
    attention_resolutions: Collection[int],
    dropout: float = 0.0,
    channel_mult: Sequence[float] = (1, 2, 4, 8),
    dims: int = 2,
    num_heads: int = 1,
    num_head_channels: int = -1,
    num_heads_upsample: int = -1,
    with_decoder: bool = True,
) -> None:
    """Check UNet constructor arguments (guided-diffusion's names) before anything is built.

    The one implementation of the architecture rules (``ModelConfig`` validates with it too).
    ``with_decoder=False`` checks an encoder only (``EncoderUNetModel``). The checks run in an
    order where the first failure names the cause: ``image_size`` (which fixes the resolutions)
    before ``attention_resolutions`` (which must be one of them), and both before the heads.

    :raises UNetArgumentError: naming the first bad argument, its value and what would be valid.
    """
    for name, value in (
        ("in_channels", in_channels),
        ("model_channels", model_channels),
        ("out_channels", out_channels),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UNetArgumentError(name, value, "must be a positive int")
    if (
        isinstance(num_res_blocks, bool)
        or not isinstance(num_res_blocks, int)
        or num_res_blocks < 0
    ):
        raise UNetArgumentError(
            "num_res_blocks",
            num_res_blocks,
            "must be an int >= 0 (if you passed improved-diffusion's positional arguments, use "
            "UNetModel.from_improved_diffusion_args or keywords)",
        )
    if dims not in (1, 2, 3):
        raise UNetArgumentError("dims", dims, "must be 1, 2 or 3")
    if not 0.0 <= dropout < 1.0:
        raise UNetArgumentError("dropout", dropout, "must be in [0, 1)")
    if len(channel_mult) == 0:
        raise UNetArgumentError("channel_mult", channel_mult, "must list at least one multiplier")
    _check_levels(
        image_size=image_size,
        model_channels=model_channels,
        channel_mult=channel_mult,
        attention_resolutions=attention_resolutions,
    )
    _check_heads(
        model_channels=model_channels,
        channel_mult=channel_mult,
        attention_resolutions=attention_resolutions,
        num_heads=num_heads,
        num_head_channels=num_head_channels,
        num_heads_upsample=num_heads_upsample,
        with_decoder=with_decoder,
    )


def _check_levels(
    *,
    image_size: int | None,
    model_channels: int,
    channel_mult: Sequence[float],
    attention_resolutions: Collection[int],
) -> None:
    """Each level's channels fit GroupNorm, the image halves at every level, and attention sits
    at one of the levels' downsample rates."""
    for level, mult in enumerate(channel_mult):
        channels = int(mult * model_channels)
        if channels < NUM_NORM_GROUPS or channels % NUM_NORM_GROUPS != 0:
            raise UNetArgumentError(
                "model_channels",
                model_channels,
                f"times channel_mult[{level}]={mult} it gives {model_channels} * {mult} = "
                f"{channels} channels at level {level}, but GroupNorm uses {NUM_NORM_GROUPS} "
                f"groups: every level's channel count must be a positive multiple of "
                f"{NUM_NORM_GROUPS} (divisible by {NUM_NORM_GROUPS}); channel_mult="
                f"{tuple(channel_mult)}",
            )

    num_downsamples = len(channel_mult) - 1
    if image_size is not None:
        factor = 2**num_downsamples
        if image_size < 1 or image_size % factor != 0:
            raise UNetArgumentError(
                "image_size",
                image_size,
                f"must be a positive multiple of {factor} (divisible by 2^{num_downsamples}) to "
                f"be downsampled {num_downsamples} times: channel_mult={tuple(channel_mult)} has "
                f"{len(channel_mult)} levels",
            )

    valid_rates = [2**level for level in range(len(channel_mult))]
    for rate in attention_resolutions:
        if rate not in valid_rates:
            raise UNetArgumentError(
                "attention_resolutions",
                attention_resolutions,
                f"it contains {rate!r}, but with channel_mult of length {len(channel_mult)} the "
                f"downsample rates are {valid_rates}. attention_resolutions holds downsample "
                "rates (image_size // resolution, e.g. 16px attention at image_size 32 is rate "
                "2), not pixel resolutions",
                item=rate,
            )


def _check_heads(
    *,
    model_channels: int,
    channel_mult: Sequence[float],
    attention_resolutions: Collection[int],
    num_heads: int,
    num_head_channels: int,
    num_heads_upsample: int,
    with_decoder: bool,
) -> None:
    """Every attention layer splits its channels evenly into heads."""
    has_attention = [2**level in attention_resolutions for level in range(len(channel_mult))]
    down_channels = [
        int(m * model_channels) for m, a in zip(channel_mult, has_attention, strict=True) if a
    ]
    down_channels.append(int(channel_mult[-1] * model_channels))  # middle block
    checks = [(c, num_heads, "num_heads") for c in down_channels]
    if with_decoder:
        up_heads = num_heads if num_heads_upsample == -1 else num_heads_upsample
        checks += [
            (int(m * model_channels), up_heads, "num_heads_upsample")
            for m, a in zip(channel_mult, has_attention, strict=True)
            if a
        ]
    for channels, heads, heads_name in checks:
        if num_head_channels != -1:
            if num_head_channels < 1 or channels % num_head_channels != 0:
                raise UNetArgumentError(
                    "num_head_channels",
                    num_head_channels,
                    f"must divide every attention layer's channel count, but {channels} is not "
                    f"divisible by it; use -1 (num_heads instead) or a divisor of {channels}",
                )
        elif heads < 1 or channels % heads != 0:
            raise UNetArgumentError(
                heads_name,
                heads,
                "must be a positive divisor of every attention layer's channel count, but an "
                f"attention layer has {channels} channels",
            )
