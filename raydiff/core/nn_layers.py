"""Small neural-network building blocks shared by the UNet models.

These mirror the helpers of improved-diffusion / guided-diffusion ``nn.py`` (same numerics, same
module types so that state-dict keys match) but are written for speed on current PyTorch: fused
``nn.SiLU`` instead of ``x * sigmoid(x)``, and a GroupNorm that skips dtype round trips when the
input is already float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from raydiff.core.unet_arguments import NUM_NORM_GROUPS

ModuleT = TypeVar("ModuleT", bound=nn.Module)


class GroupNorm32(nn.GroupNorm):
    """GroupNorm that always normalises in float32 and returns the input's dtype.

    Statistics over half-precision activations lose too much precision, so the originals upcast.
    For float32 inputs (the common case) we call the kernel directly: no cast, no copy. So do we
    for bfloat16 on CPU: that kernel takes bf16 activations with fp32 weights and accumulates and
    normalises in fp32, rounding once on output, which is what the upcast does (outputs agree to
    one bf16 ulp on ~1e-5 of elements) at a tenth of the cost of the two casts here.
    """

    @staticmethod
    def _kernel_computes_in_fp32(x: torch.Tensor) -> bool:
        """Whether the kernel already computes in fp32 for ``x`` (no upcast needed)."""
        return x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and x.device.type == "cpu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._kernel_computes_in_fp32(x):
            return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)
        out = F.group_norm(x.float(), self.num_groups, self.weight, self.bias, self.eps)
        return out.to(x.dtype)

    def forward_modulated(
        self, x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor
    ) -> torch.Tensor:
        """``self(x) * (1 + scale) + shift`` with per-sample ``scale``, ``shift`` ``[B, C]``.

        The scale-shift norm of the originals' ResBlock (IDDPM / ADM "AdaGN"), in a single
        group-norm kernel: ``(x_hat * w + b) * (1 + s) + t = x_hat * (w * (1 + s)) + (b * (1 + s)
        + t)`` is a per-(sample, channel) affine map, and a group norm of the ``[1, B * C, ...]``
        view with ``B * G`` groups has exactly the per-sample groups of ``x``. That saves the
        separate broadcast multiply-add and its backward pass (slow in bf16 on CPU); values differ
        from the two-step form only by float rounding.
        """
        batch, channels = x.shape[:2]
        gain = 1 + scale  # [B, C]
        weight = (self.weight * gain).reshape(-1)  # [B * C]
        bias = torch.addcmul(shift, self.bias, gain).reshape(-1)  # [B * C]
        folded = x.reshape(1, batch * channels, *x.shape[2:])  # [1, B * C, *spatial]
        groups = batch * self.num_groups
        if self._kernel_computes_in_fp32(x):
            return F.group_norm(folded, groups, weight, bias, self.eps).view_as(x)
        out = F.group_norm(folded.float(), groups, weight.float(), bias.float(), self.eps)
        return out.view_as(x).to(x.dtype)


def normalization(channels: int) -> GroupNorm32:
    """Make the standard normalisation layer: ``GroupNorm32(32, channels)``.

    Raises:
        ValueError: if ``channels`` is not divisible by 32.
    """
    if channels % NUM_NORM_GROUPS != 0:
        raise ValueError(
            f"GroupNorm uses {NUM_NORM_GROUPS} groups, so the channel count must be divisible by "
            f"{NUM_NORM_GROUPS}; got {channels} channels"
        )
    return GroupNorm32(NUM_NORM_GROUPS, channels)


def _of_dims(dims: int, types: tuple[type[ModuleT], ...]) -> type[ModuleT]:
    if dims not in (1, 2, 3):
        raise ValueError(f"dims must be 1, 2 or 3, got {dims}")
    return types[dims - 1]


def conv_nd(dims: int, *args: Any, **kwargs: Any) -> nn.Conv1d | nn.Conv2d | nn.Conv3d:
    """Create a 1D, 2D or 3D convolution (``nn.ConvNd`` arguments after ``dims``)."""
    return _of_dims(dims, (nn.Conv1d, nn.Conv2d, nn.Conv3d))(*args, **kwargs)


def avg_pool_nd(dims: int, *args: Any, **kwargs: Any) -> nn.AvgPool1d | nn.AvgPool2d | nn.AvgPool3d:
    """Create a 1D, 2D or 3D average pooling layer."""
    return _of_dims(dims, (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d))(*args, **kwargs)


def zero_module(module: ModuleT) -> ModuleT:
    """Zero the parameters of ``module`` in place and return it.

    Output convolutions of residual branches start at zero so every block is initially the
    identity, which stabilises early training.
    """
    for param in module.parameters():
        param.detach().zero_()
    return module


_CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def convert_module_to_f16(module: nn.Module) -> None:
    """Cast a convolution's weight and bias to float16 (other modules are left alone).

    Matches guided-diffusion's ``fp16_util.convert_module_to_f16``: only convolutions are
    converted; norms and linear (embedding) layers stay float32. Use with ``Module.apply``.
    """
    if isinstance(module, _CONV_TYPES):
        module.weight.data = module.weight.data.half()
        if module.bias is not None:
            module.bias.data = module.bias.data.half()


def convert_module_to_f32(module: nn.Module) -> None:
    """Undo :func:`convert_module_to_f16`."""
    if isinstance(module, _CONV_TYPES):
        module.weight.data = module.weight.data.float()
        if module.bias is not None:
            module.bias.data = module.bias.data.float()


def timestep_embedding(
    timesteps: torch.Tensor, dim: int, max_period: float = 10000.0
) -> torch.Tensor:
    """Sinusoidal timestep embeddings, ``[cos(t * f_i), sin(t * f_i)]`` (DDPM / Transformer).

    Args:
        timesteps: ``[N]`` tensor of (possibly fractional) timesteps.
        dim: embedding width; an odd ``dim`` gets one trailing zero column.
        max_period: sets the lowest frequency, ``f_i = max_period ** (-i / (dim // 2))``.

    Returns:
        ``[N, dim]`` float32 tensor.
    """
    half = dim // 2
    # Computed exactly as the originals (float32 exp of a float32 ramp) so values match bitwise.
    freqs = torch.exp(
        -math.log(max_period)
        * torch.arange(half, dtype=torch.float32, device=timesteps.device)
        / half
    )  # [half]
    args = timesteps[:, None].float() * freqs[None]  # [N, half]
    embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)  # [N, 2 * half]
    if dim % 2:
        embedding = F.pad(embedding, (0, 1))  # [N, dim]
    return embedding


def _phase_taps(weight: torch.Tensor, dim: int) -> torch.Tensor:
    """The 3 kernel taps along ``dim`` combined into 2 per output phase: ``[2, ...]``.

    After nearest x2 upsampling, output phase 0 (even rows) reads low-res rows (i - 1, i) with
    kernel rows (0, 1 + 2); phase 1 (odd rows) reads (i, i + 1) with (0 + 1, 2). Sums of slices
    rather than a product with a constant 0/1 matrix: building that matrix on every call would
    copy it host-to-device on a GPU, a sync in every upsampling layer.
    """
    k0, k1, k2 = weight.unbind(dim)
    even = torch.stack([k0, k1 + k2], dim)
    odd = torch.stack([k0 + k1, k2], dim)
    return torch.stack([even, odd])


#: Below this low-res size the decomposition's extra copies cost more than the FLOPs it saves.
MIN_SIZE_FOR_UPSAMPLE_DECOMPOSITION = 8


def upsample_nearest2x_conv3x3(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``conv2d(interpolate(x, scale_factor=2, mode="nearest"), weight, bias, padding=1)``.

    Same linear map, computed on the low-resolution input: each of the four output phases
    (even/odd row x even/odd column) of a 3x3 convolution over a nearest-upsampled image is a 2x2
    convolution of the original image whose taps are sums of the 3x3 taps. That does 16 instead
    of 36 multiply-adds per low-res pixel and channel pair (2.25x fewer FLOPs, forward and
    backward) and never materialises the upsampled input. Results equal the direct form up to
    float rounding (the taps are summed before, not after, the multiplication).

    Args:
        x: ``[B, I, H, W]``.
        weight: ``[O, I, 3, 3]`` (the ``conv`` of an ``Upsample``, unchanged in the state dict).
        bias: ``[O]`` or ``None``.

    Returns:
        ``[B, O, 2H, 2W]``.
    """
    batch, _, height, width = x.shape
    out_channels = weight.shape[0]
    rows = _phase_taps(weight, 2)  # [row phase, O, I, 2, 3]
    both = _phase_taps(rows, 4).transpose(0, 1)  # [row phase, col phase, O, I, 2, 2]
    # -> [4 * O, I, 2, 2], phase-major.
    phase_weight = both.reshape(4 * out_channels, *weight.shape[1:2], 2, 2)
    phase_bias = bias.repeat(4) if bias is not None else None
    # Padding 1 with a 2x2 kernel: output (j, k) covers low-res rows (j - 1, j), cols (k - 1, k).
    y = F.conv2d(x, phase_weight, phase_bias, padding=1)  # [B, 4 * O, H + 1, W + 1]
    y = y.view(batch, 2, 2, out_channels, height + 1, width + 1)
    out = y.new_empty(batch, out_channels, height, 2, width, 2)
    for row_phase in range(2):
        for col_phase in range(2):
            # Even rows need j = i, odd rows j = i + 1 (likewise for columns).
            out[:, :, :, row_phase, :, col_phase] = y[
                :,
                row_phase,
                col_phase,
                :,
                row_phase : row_phase + height,
                col_phase : col_phase + width,
            ]
    return out.view(batch, out_channels, 2 * height, 2 * width)  # [B, O, 2H, 2W]


def maybe_checkpoint(
    module: nn.Module, function: Callable[..., torch.Tensor], *args: torch.Tensor, enabled: bool
) -> torch.Tensor:
    """Run ``function(*args)``, with gradient checkpointing when it can save memory.

    Checkpointing only pays off while training with autograd recording, so evaluation and
    ``no_grad`` sampling take the plain path. The non-reentrant implementation restores the RNG
    state (dropout masks are identical on recomputation), so gradients equal the plain path.
    """
    if enabled and module.training and torch.is_grad_enabled():
        return checkpoint(function, *args, use_reentrant=False)
    return function(*args)
