"""SDPA attention against the originals' einsum formulas (legacy and new qkv order)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from raydiff.core.attention import (
    AttentionBlock,
    AttentionPool2d,
    qkv_attention,
)


def channel_first(n_heads: int, *, new_order: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """``qkv_attention`` on the originals' channel-first layout: ``[B, 3HC, T] -> [B, HC, T]``."""
    return lambda qkv: qkv_attention(qkv.transpose(1, 2), n_heads, new_order=new_order).transpose(
        1, 2
    )


def legacy_einsum_attention(qkv: torch.Tensor, n_heads: int) -> torch.Tensor:
    """improved-diffusion / guided-diffusion ``QKVAttentionLegacy``: heads first, then q, k, v.

    ``qkv: [N, H * 3 * C, T] -> [N, H * C, T]``.
    """
    bs, width, length = qkv.shape
    ch = width // (3 * n_heads)
    q, k, v = qkv.reshape(bs * n_heads, ch * 3, length).split(ch, dim=1)
    scale = 1 / math.sqrt(math.sqrt(ch))
    weight = torch.einsum("bct,bcs->bts", q * scale, k * scale)
    weight = torch.softmax(weight.float(), dim=-1).type(weight.dtype)
    a = torch.einsum("bts,bcs->bct", weight, v)
    return a.reshape(bs, -1, length)


def new_order_einsum_attention(qkv: torch.Tensor, n_heads: int) -> torch.Tensor:
    """guided-diffusion ``QKVAttention``: q, k, v first, then heads. ``[N, 3*H*C, T] -> [N, H*C, T]``."""
    bs, width, length = qkv.shape
    ch = width // (3 * n_heads)
    q, k, v = qkv.chunk(3, dim=1)
    scale = 1 / math.sqrt(math.sqrt(ch))
    weight = torch.einsum(
        "bct,bcs->bts",
        (q * scale).view(bs * n_heads, ch, length),
        (k * scale).view(bs * n_heads, ch, length),
    )
    weight = torch.softmax(weight.float(), dim=-1).type(weight.dtype)
    a = torch.einsum("bts,bcs->bct", weight, v.reshape(bs * n_heads, ch, length))
    return a.reshape(bs, -1, length)


def reference_attention_block(
    block: AttentionBlock, x: torch.Tensor, *, new_order: bool
) -> torch.Tensor:
    """The originals' ``AttentionBlock._forward`` with their conv1d projections."""
    b, c, *spatial = x.shape
    x = x.reshape(b, c, -1)
    qkv = block.qkv(block.norm(x))  # Conv1d on [B, C, T]
    attend = new_order_einsum_attention if new_order else legacy_einsum_attention
    h = block.proj_out(attend(qkv, block.num_heads))
    return (x + h).reshape(b, c, *spatial)


@pytest.mark.parametrize("n_heads", [1, 2, 4])
@pytest.mark.parametrize("length", [1, 7, 64])
def test_sdpa_matches_legacy_einsum(n_heads: int, length: int) -> None:
    torch.manual_seed(0)
    qkv = torch.randn(3, n_heads * 3 * 8, length)
    expected = legacy_einsum_attention(qkv, n_heads)
    torch.testing.assert_close(
        channel_first(n_heads, new_order=False)(qkv), expected, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("n_heads", [1, 2, 4])
@pytest.mark.parametrize("length", [1, 7, 64])
def test_sdpa_matches_new_order_einsum(n_heads: int, length: int) -> None:
    torch.manual_seed(0)
    qkv = torch.randn(3, 3 * n_heads * 8, length)
    expected = new_order_einsum_attention(qkv, n_heads)
    torch.testing.assert_close(
        channel_first(n_heads, new_order=True)(qkv), expected, rtol=1e-5, atol=1e-5
    )


def test_orders_differ_with_several_heads() -> None:
    # Guards against both paths silently using the same layout.
    torch.manual_seed(0)
    qkv = torch.randn(2, 3 * 4 * 8, 16)
    assert not torch.allclose(
        channel_first(4, new_order=True)(qkv), channel_first(4, new_order=False)(qkv)
    )


def test_orders_agree_with_one_head() -> None:
    torch.manual_seed(0)
    qkv = torch.randn(2, 3 * 16, 16)
    torch.testing.assert_close(
        channel_first(1, new_order=True)(qkv), channel_first(1, new_order=False)(qkv)
    )


def test_token_major_function_matches_channel_first() -> None:
    torch.manual_seed(0)
    qkv = torch.randn(2, 3 * 2 * 8, 10)  # [B, 3HC, T]
    out = qkv_attention(qkv.transpose(1, 2), 2, new_order=False)  # [B, T, HC]
    torch.testing.assert_close(out.transpose(1, 2), legacy_einsum_attention(qkv, 2))


def test_sdpa_gradients_match_einsum() -> None:
    torch.manual_seed(0)
    qkv = torch.randn(2, 3 * 2 * 8, 12, requires_grad=True)
    grad_out = torch.randn(2, 2 * 8, 12)
    (g_ref,) = torch.autograd.grad(legacy_einsum_attention(qkv, 2), qkv, grad_out)
    (g_new,) = torch.autograd.grad(channel_first(2, new_order=False)(qkv), qkv, grad_out)
    torch.testing.assert_close(g_new, g_ref, rtol=1e-5, atol=1e-5)


def _randomize(module: torch.nn.Module) -> None:
    # proj_out is zero-initialised, which would make the block the identity; randomise it all.
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.2)


@pytest.mark.parametrize("new_order", [False, True])
@pytest.mark.parametrize(
    ("num_heads", "num_head_channels", "expected_heads"), [(1, -1, 1), (4, -1, 4), (1, 16, 4)]
)
def test_attention_block_matches_reference(
    new_order: bool, num_heads: int, num_head_channels: int, expected_heads: int
) -> None:
    torch.manual_seed(0)
    block = AttentionBlock(
        64,
        num_heads=num_heads,
        num_head_channels=num_head_channels,
        use_new_attention_order=new_order,
    )
    assert block.num_heads == expected_heads
    _randomize(block)
    x = torch.randn(2, 64, 4, 4)
    expected = reference_attention_block(block, x, new_order=new_order)
    torch.testing.assert_close(block(x), expected, rtol=1e-5, atol=1e-5)


def test_attention_block_keys_and_zero_init() -> None:
    block = AttentionBlock(64, num_heads=2)
    shapes = {k: tuple(v.shape) for k, v in block.state_dict().items()}
    assert shapes == {
        "norm.weight": (64,),
        "norm.bias": (64,),
        "qkv.weight": (192, 64, 1),
        "qkv.bias": (192,),
        "proj_out.weight": (64, 64, 1),
        "proj_out.bias": (64,),
    }
    assert not block.proj_out.weight.any() and not block.proj_out.bias.any()
    x = torch.randn(1, 64, 3, 5)
    torch.testing.assert_close(block(x), x)  # identity at initialisation


def test_attention_block_1d_and_3d_inputs() -> None:
    torch.manual_seed(0)
    block = AttentionBlock(32, num_heads=2)
    _randomize(block)
    for shape in [(2, 32, 9), (2, 32, 2, 3, 4)]:
        x = torch.randn(shape)
        out = block(x)
        assert out.shape == x.shape
        expected = reference_attention_block(block, x, new_order=False)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_attention_block_validation_messages() -> None:
    with pytest.raises(ValueError, match=r"num_head_channels=24 .* divisor of .* 64"):
        AttentionBlock(64, num_head_channels=24)
    with pytest.raises(ValueError, match=r"num_heads=3 .* divisor of .* 64"):
        AttentionBlock(64, num_heads=3)
    with pytest.raises(ValueError, match="divisible by 32"):
        AttentionBlock(48)


def test_attention_pool_matches_reference_formula() -> None:
    torch.manual_seed(0)
    pool = AttentionPool2d(spacial_dim=4, embed_dim=64, num_heads_channels=32, output_dim=10)
    _randomize(pool)
    x = torch.randn(2, 64, 4, 4)
    # guided-diffusion's AttentionPool2d.forward, with its conv1d projections.
    h = x.reshape(2, 64, -1)
    h = torch.cat([h.mean(dim=-1, keepdim=True), h], dim=-1)
    h = h + pool.positional_embedding[None]
    h = pool.c_proj(new_order_einsum_attention(pool.qkv_proj(h), 2))
    torch.testing.assert_close(pool(x), h[:, :, 0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("new_order", [False, True])
def test_bf16_cpu_attention_matches_the_originals_half_precision_formula(new_order: bool) -> None:
    # bf16 on CPU takes the bmm + softmax path; it must agree with the originals' einsum run in
    # bf16 (softmax in fp32) as closely as two bf16 computations of the same thing can, and with
    # the fp32 result to bf16 precision.
    torch.manual_seed(0)
    qkv = torch.randn(2, 3 * 4 * 16, 64)
    attend = channel_first(4, new_order=new_order)
    formula = new_order_einsum_attention if new_order else legacy_einsum_attention
    out = attend(qkv.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), formula(qkv.bfloat16(), 4).float(), rtol=0, atol=0.03)
    torch.testing.assert_close(out.float(), formula(qkv, 4), rtol=0, atol=0.03)


def test_bf16_cpu_attention_gradients_match_fp32() -> None:
    torch.manual_seed(0)
    qkv = torch.randn(2, 64, 3 * 2 * 16, requires_grad=True)  # token-major [B, T, 3 * H * ch]
    grad_out = torch.randn(2, 64, 2 * 16)
    (grad_fp32,) = torch.autograd.grad(qkv_attention(qkv, 2, new_order=False), qkv, grad_out)
    out_bf16 = qkv_attention(qkv.bfloat16(), 2, new_order=False)
    (grad_bf16,) = torch.autograd.grad(out_bf16, qkv, grad_out.bfloat16())
    assert grad_bf16.dtype == torch.float32  # flows back through the cast to the fp32 leaf
    torch.testing.assert_close(grad_bf16, grad_fp32, rtol=0, atol=0.05)
