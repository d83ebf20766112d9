"""The diffusion UNet of improved-diffusion / guided-diffusion (ADM), plus its variants.

``UNetModel``, ``SuperResModel`` and ``EncoderUNetModel`` take guided-diffusion's constructor
arguments in guided-diffusion's positional order and build modules with exactly the originals'
state-dict keys, so published ``.pt`` checkpoints load with ``load_state_dict(strict=True)``.
improved-diffusion's layout is the same for the options it has (its ``UNetModel`` is guided's with
``channel_mult[0] == 1``, ``num_head_channels=-1``, legacy attention order and no
``resblock_updown``).

improved-diffusion's ``UNetModel`` has no ``image_size`` argument. Construct it either

* with keywords, leaving ``image_size`` out: ``UNetModel(in_channels=3, model_channels=128, ...)``;
* or with its positional order through :meth:`UNetModel.from_improved_diffusion_args`.

Numerics follow the originals (float32): sinusoidal embeddings, GroupNorm(32) in float32, SiLU,
scale-shift norm ``norm(h) * (1 + scale) + shift``, nearest x2 upsampling, stride-2 conv or
average-pool downsampling. Faster but equal-valued formulations are used where available: fused
SiLU, SDPA attention on token-major views (no 1x1 Conv1d), the scale-shift folded into the
group norm's own affine map (:meth:`~raydiff.core.nn_layers.GroupNorm32.forward_modulated`),
nearest-upsample + 3x3 conv computed as four 2x2 convolutions on the low-resolution input
(:func:`~raydiff.core.nn_layers.upsample_nearest2x_conv3x3`, 2.25x fewer FLOPs), and dropout
masks drawn with NumPy's PCG64 on CPU (:class:`~raydiff.core.dropout.FastDropout`, 5x cheaper
than ``bernoulli_``). In bf16 on CPU, group norms run on bf16 activations directly and attention
uses bf16 batched matmuls (the CPU flash kernel is slower in bf16).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Collection, Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from raydiff.core.attention import AttentionBlock, AttentionPool2d
from raydiff.core.dropout import FastDropout
from raydiff.core.nn_layers import (
    MIN_SIZE_FOR_UPSAMPLE_DECOMPOSITION,
    avg_pool_nd,
    conv_nd,
    convert_module_to_f16,
    convert_module_to_f32,
    maybe_checkpoint,
    normalization,
    timestep_embedding,
    upsample_nearest2x_conv3x3,
    zero_module,
)
from raydiff.core.unet_arguments import (
    UNetArgumentError,
    check_unet_architecture,
)

__all__ = [
    "Downsample",
    "EncoderUNetModel",
    "ResBlock",
    "SuperResModel",
    "TimestepBlock",
    "TimestepEmbedSequential",
    "UNetArgumentError",
    "UNetModel",
    "Upsample",
    "check_unet_architecture",
]

PoolType = Literal["adaptive", "attention", "spatial", "spatial_v2"]
_POOL_TYPES: tuple[str, ...] = ("adaptive", "attention", "spatial", "spatial_v2")


class ClassConditioningError(ValueError, AssertionError):
    """``y`` was given to an unconditional model or missing for a class-conditional one.

    A ``ValueError`` (a user mistake); also an ``AssertionError`` because the originals assert,
    so code written against them keeps working.
    """


class TimestepBlock(nn.Module):
    """A module whose ``forward`` takes the timestep embedding as a second argument."""

    @abstractmethod
    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """Apply the module to ``x`` given ``emb`` timestep embeddings."""


class TimestepEmbedSequential(nn.Sequential, TimestepBlock):
    """A sequential container that passes ``emb`` to the children that take it."""

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        for layer in self:
            x = layer(x, emb) if isinstance(layer, TimestepBlock) else layer(x)
        return x


def _decompose_upsample(x: torch.Tensor) -> bool:
    """Whether to fuse nearest x2 upsampling into the following 3x3 conv (2-D, large enough)."""
    return x.dim() == 4 and min(x.shape[2:]) >= MIN_SIZE_FOR_UPSAMPLE_DECOMPOSITION


class Upsample(nn.Module):
    """Nearest-neighbour x2 upsampling with an optional 3x3 convolution (key ``conv``).

    For ``dims=3`` only the inner two (spatial) dimensions are upsampled.
    """

    def __init__(
        self, channels: int, use_conv: bool, dims: int = 2, out_channels: int | None = None
    ) -> None:
        super().__init__()
        self.channels = channels
        self.out_channels = out_channels or channels
        self.use_conv = use_conv
        self.dims = dims
        if use_conv:
            self.conv = conv_nd(dims, self.channels, self.out_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.shape[1] == self.channels, f"expected {self.channels} channels, got {x.shape[1]}"
        if self.use_conv and _decompose_upsample(x):
            return upsample_nearest2x_conv3x3(x, self.conv.weight, self.conv.bias)
        if self.dims == 3:
            x = F.interpolate(x, (x.shape[2], x.shape[3] * 2, x.shape[4] * 2), mode="nearest")
        else:
            x = F.interpolate(x, scale_factor=2, mode="nearest")
        if self.use_conv:
            x = self.conv(x)
        return x


class Downsample(nn.Module):
    """x2 downsampling (key ``op``): stride-2 3x3 convolution or average pooling.

    For ``dims=3`` only the inner two (spatial) dimensions are downsampled.
    """

    def __init__(
        self, channels: int, use_conv: bool, dims: int = 2, out_channels: int | None = None
    ) -> None:
        super().__init__()
        self.channels = channels
        self.out_channels = out_channels or channels
        self.use_conv = use_conv
        self.dims = dims
        stride = 2 if dims != 3 else (1, 2, 2)
        self.op: nn.Module
        if use_conv:
            self.op = conv_nd(dims, self.channels, self.out_channels, 3, stride=stride, padding=1)
        else:
            if self.channels != self.out_channels:
                raise ValueError(
                    f"average-pool downsampling cannot change channels "
                    f"({self.channels} -> {self.out_channels}); use use_conv=True"
                )
            self.op = avg_pool_nd(dims, kernel_size=stride, stride=stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.shape[1] == self.channels, f"expected {self.channels} channels, got {x.shape[1]}"
        return self.op(x)


class ResBlock(TimestepBlock):
    """Residual block conditioned on the timestep embedding, optionally changing channels.

    Keys: ``in_layers`` (norm, SiLU, conv), ``emb_layers`` (SiLU, linear), ``out_layers`` (norm,
    SiLU, dropout, zero conv) and ``skip_connection`` (identity, 1x1 conv, or 3x3 conv when
    ``use_conv``). With ``up``/``down`` (guided-diffusion's ``resblock_updown``) the block also
    resamples, after the first norm/SiLU and on the skip path.
    """

    def __init__(
        self,
        channels: int,
        emb_channels: int,
        dropout: float,
        out_channels: int | None = None,
        use_conv: bool = False,
        use_scale_shift_norm: bool = False,
        dims: int = 2,
        use_checkpoint: bool = False,
        up: bool = False,
        down: bool = False,
    ) -> None:
        super().__init__()
        self.channels = channels
        self.emb_channels = emb_channels
        self.dropout = dropout
        self.out_channels = out_channels or channels
        self.use_conv = use_conv
        self.use_checkpoint = use_checkpoint
        self.use_scale_shift_norm = use_scale_shift_norm

        self.in_layers = nn.Sequential(
            normalization(channels),
            nn.SiLU(),
            conv_nd(dims, channels, self.out_channels, 3, padding=1),
        )

        self.updown = up or down
        self.h_upd: nn.Module
        self.x_upd: nn.Module
        if up:
            self.h_upd = Upsample(channels, False, dims)
            self.x_upd = Upsample(channels, False, dims)
        elif down:
            self.h_upd = Downsample(channels, False, dims)
            self.x_upd = Downsample(channels, False, dims)
        else:
            self.h_upd = self.x_upd = nn.Identity()

        self.emb_layers = nn.Sequential(
            nn.SiLU(),
            nn.Linear(
                emb_channels, 2 * self.out_channels if use_scale_shift_norm else self.out_channels
            ),
        )
        self.out_layers = nn.Sequential(
            normalization(self.out_channels),
            nn.SiLU(),
            FastDropout(p=dropout),
            zero_module(conv_nd(dims, self.out_channels, self.out_channels, 3, padding=1)),
        )

        self.skip_connection: nn.Module
        if self.out_channels == channels:
            self.skip_connection = nn.Identity()
        elif use_conv:
            self.skip_connection = conv_nd(dims, channels, self.out_channels, 3, padding=1)
        else:
            self.skip_connection = conv_nd(dims, channels, self.out_channels, 1)

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """``x: [B, C, *spatial]``, ``emb: [B, emb_channels]`` -> ``[B, out_channels, *spatial']``."""
        return maybe_checkpoint(self, self._forward, x, emb, enabled=self.use_checkpoint)

    def _forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        in_norm, in_act, in_conv = self.in_layers
        h = in_act(in_norm(x))
        if self.updown:
            if isinstance(self.h_upd, Upsample) and _decompose_upsample(h):
                h = upsample_nearest2x_conv3x3(h, in_conv.weight, in_conv.bias)
            else:
                h = in_conv(self.h_upd(h))
            x = self.x_upd(x)
        else:
            h = in_conv(h)  # [B, C_out, *spatial]

        emb_out = self.emb_layers(emb).to(h.dtype)  # [B, C_out] or [B, 2 * C_out]
        emb_out = emb_out.view(*emb_out.shape, *([1] * (h.dim() - 2)))  # broadcast over space

        out_norm, out_act, out_drop, out_conv = self.out_layers
        if self.use_scale_shift_norm:
            # FiLM-style conditioning norm(h) * (1 + scale) + shift, inside the norm's kernel.
            scale, shift = emb_out.flatten(1).chunk(2, dim=1)  # 2 x [B, C_out]
            h = out_norm.forward_modulated(h, scale, shift)
        else:
            h = out_norm(h + emb_out)
        h = out_conv(out_drop(out_act(h)))
        return self.skip_connection(x) + h


class _EncoderTrunk(nn.Module):
    """Shared construction of the time embedding, input blocks and middle block."""

    time_embed: nn.Sequential
    input_blocks: nn.ModuleList
    middle_block: TimestepEmbedSequential

    def _build_trunk(
        self,
        *,
        image_size: int | None,
        in_channels: int,
        model_channels: int,
        out_channels: int,
        num_res_blocks: int,
        attention_resolutions: Collection[int],
        dropout: float,
        channel_mult: Sequence[float],
        conv_resample: bool,
        dims: int,
        use_checkpoint: bool,
        use_fp16: bool,
        num_heads: int,
        num_head_channels: int,
        num_heads_upsample: int,
        use_scale_shift_norm: bool,
        resblock_updown: bool,
        use_new_attention_order: bool,
        with_decoder: bool,
    ) -> tuple[list[int], int, int, Callable[..., ResBlock], Callable[..., AttentionBlock]]:
        """Check the arguments, record them and build the encoder half.

        Returns ``(skip channel counts, channels, downsample rate)`` and the residual and
        attention block builders, which the decoder reuses.
        """
        check_unet_architecture(
            image_size=image_size,
            in_channels=in_channels,
            model_channels=model_channels,
            out_channels=out_channels,
            num_res_blocks=num_res_blocks,
            attention_resolutions=attention_resolutions,
            dropout=dropout,
            channel_mult=channel_mult,
            dims=dims,
            num_heads=num_heads,
            num_head_channels=num_head_channels,
            num_heads_upsample=num_heads_upsample,
            with_decoder=with_decoder,
        )
        self.image_size = image_size
        self.in_channels = in_channels
        self.model_channels = model_channels
        self.out_channels = out_channels
        self.num_res_blocks = num_res_blocks
        self.attention_resolutions = attention_resolutions
        self.dropout = dropout
        self.channel_mult = channel_mult
        self.conv_resample = conv_resample
        self.use_checkpoint = use_checkpoint
        self.use_fp16 = use_fp16
        self.num_heads = num_heads
        self.num_head_channels = num_head_channels
        self.num_heads_upsample = num_heads if num_heads_upsample == -1 else num_heads_upsample
        time_embed_dim = model_channels * 4
        self.time_embed = nn.Sequential(
            nn.Linear(model_channels, time_embed_dim),
            nn.SiLU(),
            nn.Linear(time_embed_dim, time_embed_dim),
        )

        def res_block(channels: int, out_channels: int | None = None, **kwargs: bool) -> ResBlock:
            return ResBlock(
                channels,
                time_embed_dim,
                dropout,
                out_channels=out_channels,
                dims=dims,
                use_checkpoint=use_checkpoint,
                use_scale_shift_norm=use_scale_shift_norm,
                **kwargs,
            )

        def attention_block(channels: int, heads: int = num_heads) -> AttentionBlock:
            return AttentionBlock(
                channels,
                use_checkpoint=use_checkpoint,
                num_heads=heads,
                num_head_channels=num_head_channels,
                use_new_attention_order=use_new_attention_order,
            )

        ch = int(channel_mult[0] * model_channels)
        self.input_blocks = nn.ModuleList(
            [TimestepEmbedSequential(conv_nd(dims, in_channels, ch, 3, padding=1))]
        )
        self._feature_size = ch
        input_block_chans = [ch]
        ds = 1
        for level, mult in enumerate(channel_mult):
            for _ in range(num_res_blocks):
                layers: list[nn.Module] = [res_block(ch, int(mult * model_channels))]
                ch = int(mult * model_channels)
                if ds in attention_resolutions:
                    layers.append(attention_block(ch))
                self.input_blocks.append(TimestepEmbedSequential(*layers))
                self._feature_size += ch
                input_block_chans.append(ch)
            if level != len(channel_mult) - 1:
                down = (
                    res_block(ch, ch, down=True)
                    if resblock_updown
                    else Downsample(ch, conv_resample, dims=dims, out_channels=ch)
                )
                self.input_blocks.append(TimestepEmbedSequential(down))
                input_block_chans.append(ch)
                ds *= 2
                self._feature_size += ch

        self.middle_block = TimestepEmbedSequential(
            res_block(ch), attention_block(ch), res_block(ch)
        )
        self._feature_size += ch
        return input_block_chans, ch, ds, res_block, attention_block

    _fp16_parts: tuple[str, ...] = ("input_blocks", "middle_block")
    """The blocks that ``use_fp16`` converts (the UNet adds its decoder)."""

    def convert_to_fp16(self) -> None:
        """Convert the torso's convolutions to float16 (guided-diffusion semantics)."""
        for part in self._fp16_parts:
            getattr(self, part).apply(convert_module_to_f16)

    def convert_to_fp32(self) -> None:
        """Convert the torso back to float32."""
        for part in self._fp16_parts:
            getattr(self, part).apply(convert_module_to_f32)

    @property
    def dtype(self) -> torch.dtype:
        """dtype of the model's torso (float16 after :meth:`convert_to_fp16`)."""
        return self.input_blocks[0][0].weight.dtype

    def _embed(self, timesteps: torch.Tensor) -> torch.Tensor:
        emb = timestep_embedding(timesteps, self.time_embed[0].in_features)  # [B, model_ch]
        return self.time_embed(emb.to(self.time_embed[0].weight.dtype))  # [B, 4 * model_ch]


class UNetModel(_EncoderTrunk):
    """The full UNet with attention and timestep embedding (IDDPM / ADM).

    Args follow guided-diffusion's ``UNetModel`` (same names, same positional order):

    Args:
        image_size: input resolution; only validated and stored. Optional so improved-diffusion's
            keyword calls (which have no ``image_size``) work.
        in_channels: channels of the input image (e.g. 1 for grayscale, 3 for RGB).
        model_channels: base channel count.
        out_channels: output channels (``2 * in_channels`` with a learned sigma).
        num_res_blocks: residual blocks per level.
        attention_resolutions: downsample rates (``image_size // resolution``) with attention.
        dropout: dropout probability inside residual blocks.
        channel_mult: channel multiplier per level; every ``int(mult * model_channels)`` must be
            divisible by 32 (GroupNorm groups).
        conv_resample: learned convolutions (True) or nearest/average-pool resampling.
        dims: 1, 2 or 3 spatial dimensions.
        num_classes: number of classes for class conditioning (``label_emb``), or ``None``.
        use_checkpoint: gradient checkpointing in residual and attention blocks (training only).
        use_fp16: marks the model for float16 torso weights, like guided-diffusion; call
            :meth:`convert_to_fp16` (guided's trainer does) to convert. The forward pass always
            runs the torso in the dtype its weights actually have.
        num_heads: attention heads (ignored when ``num_head_channels != -1``).
        num_head_channels: fixed channels per head, or -1 to use ``num_heads``.
        num_heads_upsample: heads in the decoder's attention (deprecated; -1 = ``num_heads``).
        use_scale_shift_norm: FiLM-like scale/shift conditioning in residual blocks.
        resblock_updown: residual blocks for up/downsampling instead of ``Upsample``/``Downsample``.
        use_new_attention_order: ``[3, heads, ch]`` qkv layout instead of the legacy
            ``[heads, 3, ch]``.
    """

    _fp16_parts = ("input_blocks", "middle_block", "output_blocks")

    def __init__(
        self,
        image_size: int | None = None,
        in_channels: int | None = None,
        model_channels: int | None = None,
        out_channels: int | None = None,
        num_res_blocks: int | None = None,
        attention_resolutions: Collection[int] | None = None,
        dropout: float = 0.0,
        channel_mult: Sequence[float] = (1, 2, 4, 8),
        conv_resample: bool = True,
        dims: int = 2,
        num_classes: int | None = None,
        use_checkpoint: bool = False,
        use_fp16: bool = False,
        num_heads: int = 1,
        num_head_channels: int = -1,
        num_heads_upsample: int = -1,
        use_scale_shift_norm: bool = False,
        resblock_updown: bool = False,
        use_new_attention_order: bool = False,
    ) -> None:
        super().__init__()
        required = {
            "in_channels": in_channels,
            "model_channels": model_channels,
            "out_channels": out_channels,
            "num_res_blocks": num_res_blocks,
            "attention_resolutions": attention_resolutions,
        }
        missing = [name for name, value in required.items() if value is None]
        if missing:
            raise TypeError(f"UNetModel missing required argument(s): {', '.join(missing)}")
        assert in_channels is not None and model_channels is not None
        assert out_channels is not None and num_res_blocks is not None
        assert attention_resolutions is not None
        if num_classes is not None and (isinstance(num_classes, bool) or num_classes < 1):
            raise ValueError(f"num_classes must be None or a positive int, got {num_classes!r}")
        self.num_classes = num_classes
        input_block_chans, ch, ds, res_block, attention_block = self._build_trunk(
            image_size=image_size,
            in_channels=in_channels,
            model_channels=model_channels,
            out_channels=out_channels,
            num_res_blocks=num_res_blocks,
            attention_resolutions=attention_resolutions,
            dropout=dropout,
            channel_mult=channel_mult,
            conv_resample=conv_resample,
            dims=dims,
            use_checkpoint=use_checkpoint,
            use_fp16=use_fp16,
            num_heads=num_heads,
            num_head_channels=num_head_channels,
            num_heads_upsample=num_heads_upsample,
            use_scale_shift_norm=use_scale_shift_norm,
            resblock_updown=resblock_updown,
            use_new_attention_order=use_new_attention_order,
            with_decoder=True,
        )
        if num_classes is not None:
            # Registered after the trunk; key order does not matter for load_state_dict.
            self.label_emb = nn.Embedding(num_classes, model_channels * 4)

        self.output_blocks = nn.ModuleList([])
        for level, mult in list(enumerate(channel_mult))[::-1]:
            for i in range(num_res_blocks + 1):
                skip_ch = input_block_chans.pop()
                layers: list[nn.Module] = [res_block(ch + skip_ch, int(model_channels * mult))]
                ch = int(model_channels * mult)
                if ds in attention_resolutions:
                    layers.append(attention_block(ch, self.num_heads_upsample))
                if level and i == num_res_blocks:
                    layers.append(
                        res_block(ch, ch, up=True)
                        if resblock_updown
                        else Upsample(ch, conv_resample, dims=dims, out_channels=ch)
                    )
                    ds //= 2
                self.output_blocks.append(TimestepEmbedSequential(*layers))
                self._feature_size += ch

        input_ch = int(channel_mult[0] * model_channels)
        self.out = nn.Sequential(
            normalization(ch),
            nn.SiLU(),
            zero_module(conv_nd(dims, input_ch, out_channels, 3, padding=1)),
        )

    @classmethod
    def from_improved_diffusion_args(cls, *args: Any, **kwargs: Any) -> UNetModel:
        """Build from improved-diffusion's ``UNetModel`` signature (positional order included).

        improved-diffusion's order is ``(in_channels, model_channels, out_channels,
        num_res_blocks, attention_resolutions, dropout=0, channel_mult=(1, 2, 4, 8),
        conv_resample=True, dims=2, num_classes=None, use_checkpoint=False, num_heads=1,
        num_heads_upsample=-1, use_scale_shift_norm=False)``.
        """
        names = (
            "in_channels",
            "model_channels",
            "out_channels",
            "num_res_blocks",
            "attention_resolutions",
            "dropout",
            "channel_mult",
            "conv_resample",
            "dims",
            "num_classes",
            "use_checkpoint",
            "num_heads",
            "num_heads_upsample",
            "use_scale_shift_norm",
        )
        if len(args) > len(names):
            raise TypeError(
                f"improved-diffusion's UNetModel takes at most {len(names)} positional "
                f"arguments, got {len(args)}"
            )
        for name, value in zip(names, args, strict=False):
            if name in kwargs:
                raise TypeError(f"got multiple values for argument {name!r}")
            kwargs[name] = value
        return cls(**kwargs)

    @property
    def inner_dtype(self) -> torch.dtype:
        """improved-diffusion's name for :attr:`dtype`."""
        return self.dtype

    def _conditioning(
        self, x: torch.Tensor, timesteps: torch.Tensor, y: torch.Tensor | None
    ) -> torch.Tensor:
        if (y is not None) != (self.num_classes is not None):
            raise ClassConditioningError(
                "must specify y if and only if the model is class-conditional "
                f"(num_classes={self.num_classes}, y given: {y is not None})"
            )
        emb = self._embed(timesteps)  # [B, 4 * model_ch]
        if y is not None:
            if y.shape != (x.shape[0],):
                raise ValueError(f"y must have shape ({x.shape[0]},), got {tuple(y.shape)}")
            emb = emb + self.label_emb(y)
        return emb

    def forward(
        self, x: torch.Tensor, timesteps: torch.Tensor, y: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Apply the model.

        Args:
            x: ``[B, C, *spatial]`` inputs.
            timesteps: ``[B]`` timesteps (may be fractional).
            y: ``[B]`` class labels, required iff the model is class-conditional.

        Returns:
            ``[B, out_channels, *spatial]`` in ``x``'s dtype.
        """
        emb = self._conditioning(x, timesteps, y)
        h = x.to(self.dtype)
        skips = []
        for module in self.input_blocks:
            h = module(h, emb)
            skips.append(h)
        h = self.middle_block(h, emb)
        for module in self.output_blocks:
            h = module(torch.cat([h, skips.pop()], dim=1), emb)
        if not torch.is_autocast_enabled(h.device.type):
            # The output layers stay fp32 when the trunk runs in fp16 (use_fp16); under autocast
            # the conv picks its own dtype, and a cast here would only add two copies.
            h = h.to(x.dtype)
        return self.out(h)  # [B, out_channels, *spatial]

    def get_feature_vectors(
        self, x: torch.Tensor, timesteps: torch.Tensor, y: torch.Tensor | None = None
    ) -> dict[str, Any]:
        """Intermediate activations, like improved-diffusion's method of the same name.

        Returns:
            ``{"down": [...], "middle": tensor, "up": [...]}`` in ``x``'s dtype.
        """
        emb = self._conditioning(x, timesteps, y)
        result: dict[str, Any] = {"down": [], "up": []}
        h = x.to(self.dtype)
        skips = []
        for module in self.input_blocks:
            h = module(h, emb)
            skips.append(h)
            result["down"].append(h.to(x.dtype))
        h = self.middle_block(h, emb)
        result["middle"] = h.to(x.dtype)
        for module in self.output_blocks:
            h = module(torch.cat([h, skips.pop()], dim=1), emb)
            result["up"].append(h.to(x.dtype))
        return result


class SuperResModel(UNetModel):
    """A UNet conditioned on a low-resolution image (``low_res``), upsampled and concatenated.

    Takes the same arguments as :class:`UNetModel`; ``in_channels`` is the channel count of the
    image (and of ``low_res``), the model's first convolution sees twice as many.
    """

    def __init__(
        self,
        image_size: int | None = None,
        in_channels: int | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        if in_channels is None:
            raise TypeError("SuperResModel missing required argument: in_channels")
        super().__init__(image_size, in_channels * 2, *args, **kwargs)

    def forward(  # type: ignore[override]
        self,
        x: torch.Tensor,
        timesteps: torch.Tensor,
        low_res: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """``x: [B, C, H, W]``, ``low_res: [B, C, h, w]`` -> ``[B, out_channels, H, W]``."""
        return super().forward(_with_low_res(x, low_res), timesteps, **kwargs)

    def get_feature_vectors(  # type: ignore[override]
        self,
        x: torch.Tensor,
        timesteps: torch.Tensor,
        low_res: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Intermediate activations for the super-resolution input."""
        return super().get_feature_vectors(_with_low_res(x, low_res), timesteps, **kwargs)


def _with_low_res(x: torch.Tensor, low_res: torch.Tensor | None) -> torch.Tensor:
    """``x: [B, C, H, W]`` and ``low_res: [B, C, h, w]`` upsampled to it -> ``[B, 2C, H, W]``."""
    if low_res is None:
        raise ValueError("SuperResModel needs low_res, the low-resolution image")
    return torch.cat([x, F.interpolate(low_res, x.shape[2:], mode="bilinear")], dim=1)


class EncoderUNetModel(_EncoderTrunk):
    """The half UNet (encoder + pooling head): guided-diffusion's noisy-image classifier.

    Same arguments as guided-diffusion's ``EncoderUNetModel`` (those of :class:`UNetModel` minus
    ``num_classes``, plus ``pool``). ``num_heads_upsample`` is accepted and unused, as there.

    Args:
        pool: output head. ``"adaptive"``: norm, SiLU, global average pool, zero 1x1 conv.
            ``"attention"``: norm, SiLU, :class:`AttentionPool2d` (needs ``num_head_channels``
            and ``image_size``). ``"spatial"`` / ``"spatial_v2"``: MLP on the spatial means of
            every block's output.
    """

    def __init__(
        self,
        image_size: int | None,
        in_channels: int,
        model_channels: int,
        out_channels: int,
        num_res_blocks: int,
        attention_resolutions: Collection[int],
        dropout: float = 0.0,
        channel_mult: Sequence[float] = (1, 2, 4, 8),
        conv_resample: bool = True,
        dims: int = 2,
        use_checkpoint: bool = False,
        use_fp16: bool = False,
        num_heads: int = 1,
        num_head_channels: int = -1,
        num_heads_upsample: int = -1,
        use_scale_shift_norm: bool = False,
        resblock_updown: bool = False,
        use_new_attention_order: bool = False,
        pool: PoolType = "adaptive",
    ) -> None:
        super().__init__()
        if pool not in _POOL_TYPES:
            raise ValueError(f"pool must be one of {_POOL_TYPES}, got {pool!r}")
        if pool == "attention":
            if num_head_channels == -1:
                raise ValueError('pool="attention" needs num_head_channels (got -1)')
            if image_size is None:
                raise ValueError('pool="attention" needs image_size (got None)')
        if pool in ("adaptive", "attention") and dims != 2:
            raise ValueError(f'pool="{pool}" supports dims=2 only, got dims={dims}')
        _, ch, ds, _, _ = self._build_trunk(
            image_size=image_size,
            in_channels=in_channels,
            model_channels=model_channels,
            out_channels=out_channels,
            num_res_blocks=num_res_blocks,
            attention_resolutions=attention_resolutions,
            dropout=dropout,
            channel_mult=channel_mult,
            conv_resample=conv_resample,
            dims=dims,
            use_checkpoint=use_checkpoint,
            use_fp16=use_fp16,
            num_heads=num_heads,
            num_head_channels=num_head_channels,
            num_heads_upsample=num_heads_upsample,
            use_scale_shift_norm=use_scale_shift_norm,
            resblock_updown=resblock_updown,
            use_new_attention_order=use_new_attention_order,
            with_decoder=False,
        )
        self.pool = pool
        if pool == "adaptive":
            self.out = nn.Sequential(
                normalization(ch),
                nn.SiLU(),
                nn.AdaptiveAvgPool2d((1, 1)),
                zero_module(conv_nd(dims, ch, out_channels, 1)),
                nn.Flatten(),
            )
        elif pool == "attention":
            assert image_size is not None
            self.out = nn.Sequential(
                normalization(ch),
                nn.SiLU(),
                AttentionPool2d(image_size // ds, ch, num_head_channels, out_channels),
            )
        else:  # an MLP on the levels' spatial means; spatial_v2 normalises its hidden layer
            hidden = [normalization(2048), nn.SiLU()] if pool == "spatial_v2" else [nn.ReLU()]
            self.out = nn.Sequential(
                nn.Linear(self._feature_size, 2048), *hidden, nn.Linear(2048, out_channels)
            )

    def forward(self, x: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        """``x: [B, C, H, W]``, ``timesteps: [B]`` -> logits ``[B, out_channels]``."""
        return self.out(self._torso(x, timesteps))  # [B, out_channels]

    def features(self, x: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        """The penultimate features ``[B, D]``: what the head's last linear map turns into the
        logits (the pooled vector; for the spatial heads, the 2048-d hidden layer)."""
        h = self._torso(x, timesteps)
        if self.pool == "attention":
            return self.out[2].pooled(self.out[:2](h))
        if self.pool == "adaptive":
            return self.out[:3](h).flatten(1)
        return self.out[:-1](h)

    def _torso(self, x: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        """The encoder's output in ``x``'s dtype: ``[B, C, h, w]``, or for the spatial heads the
        per-level spatial means concatenated, ``[B, sum C_level]``."""
        emb = self._embed(timesteps)
        spatial_pool = self.pool.startswith("spatial")
        spatial_dims = tuple(range(2, x.dim()))
        means = []
        h = x.to(self.dtype)
        for module in self.input_blocks:
            h = module(h, emb)
            if spatial_pool:
                means.append(h.to(x.dtype).mean(dim=spatial_dims))  # [B, C_level]
        h = self.middle_block(h, emb)
        if spatial_pool:
            means.append(h.to(x.dtype).mean(dim=spatial_dims))
            return torch.cat(means, dim=-1)
        return h.to(x.dtype)
