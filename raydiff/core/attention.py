"""Self-attention over spatial positions, computed with ``scaled_dot_product_attention``.

The originals compute ``softmax((q * s)^T (k * s)) v`` with ``s = ch ** -0.25`` through two
``einsum`` calls. Scaling q and k by ``ch ** -0.25`` each is the same as scaling the logits by
``ch ** -0.5``, which is SDPA's default scale, so :func:`torch.nn.functional.scaled_dot_product_attention`
gives the same values while using a fused kernel (no materialised ``[T, T]`` weights on CPU
flash attention, less memory traffic in the backward pass).

Two channel layouts of the packed ``qkv`` tensor exist and both are supported:

* legacy order (improved-diffusion, guided-diffusion's ``QKVAttentionLegacy``): channels are laid
  out as ``[heads, 3, ch]`` -- the tensor is split into heads first, then into q, k, v;
* new order (guided-diffusion's ``QKVAttention``, ``use_new_attention_order=True``): channels are
  ``[3, heads, ch]`` -- split into q, k, v first, then into heads.

Internally everything is token-major (``[B, T, C]``) so that the 1x1 ``qkv`` / ``proj_out``
convolutions become plain matrix multiplies and no layout copies are needed around SDPA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from raydiff.core.nn_layers import conv_nd, maybe_checkpoint, normalization, zero_module


def qkv_attention(qkv: torch.Tensor, num_heads: int, *, new_order: bool) -> torch.Tensor:
    """Multi-head attention on a packed token-major ``qkv`` tensor.

    Args:
        qkv: ``[B, T, 3 * H * ch]`` queries, keys and values for ``T`` tokens.
        num_heads: ``H``.
        new_order: ``True`` for the ``[3, H, ch]`` channel layout, ``False`` for the legacy
            ``[H, 3, ch]`` layout (see the module docstring).

    Returns:
        ``[B, T, H * ch]`` attention output, channel index ``h * ch + c`` (both orders).
    """
    batch, length, width = qkv.shape
    assert width % (3 * num_heads) == 0, f"qkv width {width} not divisible by 3 * {num_heads}"
    ch = width // (3 * num_heads)
    if new_order:
        q, k, v = qkv.view(batch, length, 3, num_heads, ch).unbind(2)  # 3 x [B, T, H, ch]
    else:
        q, k, v = qkv.view(batch, length, num_heads, 3, ch).unbind(3)  # 3 x [B, T, H, ch]
    # [B, H, T, ch] views; SDPA's default scale 1/sqrt(ch) equals the originals' ch**-0.25 on
    # both q and k.
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if qkv.device.type == "cpu" and qkv.dtype == torch.bfloat16:
        # CPU flash attention is slower in bf16 than in fp32 (2x in the backward pass here); two
        # bf16 batched matmuls around a softmax are 1.6x faster than the fp32 kernel with its
        # casts. The bf16 softmax kernel computes in fp32 and rounds once, as the originals'
        # ``softmax(w.float()).type(w.dtype)`` does.
        weights = torch.softmax(torch.matmul(q * ch**-0.5, k.transpose(-1, -2)), dim=-1)
        out = torch.matmul(weights, v)  # [B, H, T, ch]
    elif qkv.device.type == "cpu" and qkv.dtype == torch.float16:
        # No fast fp16 matmul on most CPUs: attend in fp32 (the softmax is fp32 in the originals).
        out_dtype = qkv.dtype
        with torch.autocast("cpu", enabled=False):
            out = F.scaled_dot_product_attention(q.float(), k.float(), v.float()).to(out_dtype)
    else:
        out = F.scaled_dot_product_attention(q, k, v)
    return out.transpose(1, 2).reshape(batch, length, num_heads * ch)  # [B, T, H * ch]


def resolve_num_heads(channels: int, num_heads: int, num_head_channels: int) -> int:
    """Number of heads for ``channels``; ``num_head_channels != -1`` overrides ``num_heads``.

    Raises:
        ValueError: if the channels cannot be split evenly into heads.
    """
    if num_head_channels == -1:
        if num_heads < 1 or channels % num_heads != 0:
            raise ValueError(
                f"num_heads={num_heads} must be a positive divisor of the attention channel "
                f"count {channels}"
            )
        return num_heads
    if num_head_channels < 1 or channels % num_head_channels != 0:
        raise ValueError(
            f"num_head_channels={num_head_channels} must be -1 (use num_heads) or a positive "
            f"divisor of the attention channel count {channels}"
        )
    return channels // num_head_channels


class AttentionBlock(nn.Module):
    """Residual self-attention over all spatial positions of an N-d feature map.

    State-dict keys match the originals: ``norm`` (GroupNorm32), ``qkv`` (Conv1d C -> 3C, kernel
    1) and ``proj_out`` (Conv1d C -> C, zero-initialised). The convolutions are applied as
    matrix multiplies on token-major views, which is the same math without layout copies.

    Unlike guided-diffusion, which always checkpoints attention, checkpointing here follows
    ``use_checkpoint`` (it only trades compute for memory; values are identical).
    """

    def __init__(
        self,
        channels: int,
        num_heads: int = 1,
        num_head_channels: int = -1,
        use_checkpoint: bool = False,
        use_new_attention_order: bool = False,
    ) -> None:
        super().__init__()
        self.channels = channels
        self.num_heads = resolve_num_heads(channels, num_heads, num_head_channels)
        self.use_checkpoint = use_checkpoint
        self.use_new_attention_order = use_new_attention_order
        self.norm = normalization(channels)
        self.qkv = conv_nd(1, channels, channels * 3, 1)
        self.proj_out = zero_module(conv_nd(1, channels, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C, *spatial] -> [B, C, *spatial]``."""
        return maybe_checkpoint(self, self._forward, x, enabled=self.use_checkpoint)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, channels, *spatial = x.shape
        # GroupNorm on the N-d map (its fast path), then a free token-major view.
        tokens = self.norm(x).flatten(2).transpose(1, 2)  # [B, T, C] (a view)
        # Conv1d with kernel 1 == linear on tokens; weight [3C, C, 1] -> [3C, C] view.
        qkv = F.linear(tokens, self.qkv.weight.squeeze(-1), self.qkv.bias)  # [B, T, 3C]
        h = qkv_attention(qkv, self.num_heads, new_order=self.use_new_attention_order)
        h = F.linear(h, self.proj_out.weight.squeeze(-1), self.proj_out.bias)  # [B, T, C]
        h = h.transpose(1, 2).reshape(batch, channels, *spatial)  # [B, C, *spatial]
        return x + h


class AttentionPool2d(nn.Module):
    """Attention pooling head of guided-diffusion's classifier (adapted there from CLIP).

    Keys: ``positional_embedding`` ``[C, HW + 1]``, ``qkv_proj`` (Conv1d C -> 3C), ``c_proj``
    (Conv1d C -> output_dim). Uses the new ``[3, H, ch]`` qkv order, as the original does.
    """

    def __init__(
        self,
        spacial_dim: int,
        embed_dim: int,
        num_heads_channels: int,
        output_dim: int | None = None,
    ) -> None:
        super().__init__()
        self.positional_embedding = nn.Parameter(
            torch.randn(embed_dim, spacial_dim**2 + 1) / embed_dim**0.5
        )
        self.qkv_proj = conv_nd(1, embed_dim, 3 * embed_dim, 1)
        self.c_proj = conv_nd(1, embed_dim, output_dim or embed_dim, 1)
        self.num_heads = resolve_num_heads(embed_dim, 1, num_heads_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W] -> [B, output_dim]``."""
        # Only the pooled (mean) token is returned, so project just that one.
        return F.linear(self.pooled(x), self.c_proj.weight.squeeze(-1), self.c_proj.bias)

    def pooled(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W] -> [B, C]``: the attended mean token, before the output projection."""
        batch, channels = x.shape[:2]
        x = x.reshape(batch, channels, -1)  # [B, C, HW]
        x = torch.cat([x.mean(dim=-1, keepdim=True), x], dim=-1)  # [B, C, HW + 1]
        x = x + self.positional_embedding[None].to(x.dtype)
        tokens = x.transpose(1, 2)  # [B, HW + 1, C]
        qkv = F.linear(tokens, self.qkv_proj.weight.squeeze(-1), self.qkv_proj.bias)
        return qkv_attention(qkv, self.num_heads, new_order=True)[:, 0]  # [B, C]
