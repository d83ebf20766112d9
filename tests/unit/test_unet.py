"""UNetModel / SuperResModel / EncoderUNetModel: shapes, key layout, numerics, precision, errors."""

from __future__ import annotations

import math
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from raydiff.core.nn_layers import (
    GroupNorm32,
    timestep_embedding,
    upsample_nearest2x_conv3x3,
)
from raydiff.core.unet import (
    EncoderUNetModel,
    SuperResModel,
    UNetArgumentError,
    UNetModel,
    check_unet_architecture,
)

FIXTURES = Path(__file__).parent / "fixtures"

# Tiny model: model_channels 32, one res block, two levels, 16x16 images.
SMALL: dict[str, Any] = dict(
    image_size=16,
    in_channels=3,
    model_channels=32,
    out_channels=6,
    num_res_blocks=1,
    attention_resolutions=(2,),
    channel_mult=(1, 2),
)


def _inputs(batch: int = 2, channels: int = 3, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(batch, channels, size, size), torch.tensor([0.0, 517.5])[:batch]


def _randomize(model: torch.nn.Module, seed: int = 1) -> None:
    # Zero-initialised output convs make outputs trivially zero; randomise every weight.
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.1)


def _read_key_fixture(name: str) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for line in (FIXTURES / name).read_text().splitlines():
        if line and not line.startswith("#"):
            key, shape = line.split()
            shapes[key] = tuple(int(s) for s in shape.split(","))
    return shapes


def _shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------------------------
# Key layout against the reference source
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "cls", "kwargs"),
    [
        ("unet_keys_small.txt", UNetModel, SMALL),
        (
            "unet_keys_updown_classcond.txt",
            UNetModel,
            dict(SMALL, resblock_updown=True, num_classes=10, use_scale_shift_norm=True),
        ),
        (
            "encoder_keys_attention_pool.txt",
            EncoderUNetModel,
            dict(SMALL, out_channels=10, pool="attention", num_head_channels=32),
        ),
    ],
)
def test_state_dict_keys_match_reference_layout(fixture: str, cls: type, kwargs: dict) -> None:
    expected = _read_key_fixture(fixture)
    assert _shapes(cls(**kwargs)) == expected


def test_improved_diffusion_style_construction_has_same_keys() -> None:
    by_keywords = UNetModel(**{k: v for k, v in SMALL.items() if k != "image_size"})
    positional = UNetModel.from_improved_diffusion_args(3, 32, 6, 1, (2,), 0.0, (1, 2))
    expected = _read_key_fixture("unet_keys_small.txt")
    assert _shapes(by_keywords) == expected
    assert _shapes(positional) == expected
    assert by_keywords.image_size is None


def test_guided_positional_order() -> None:
    model = UNetModel(
        16, 3, 32, 6, 1, (2,), 0.1, (1, 2), True, 2, 10, False, False, 2, -1, -1, True
    )
    assert model.num_classes == 10 and model.dropout == 0.1 and model.num_heads == 2
    assert "label_emb.weight" in model.state_dict()


def test_variant_key_details() -> None:
    keys = UNetModel(**SMALL, num_classes=5, use_scale_shift_norm=True).state_dict()
    assert keys["label_emb.weight"].shape == (5, 128)
    # scale-shift doubles the embedding projection
    assert keys["input_blocks.1.0.emb_layers.1.weight"].shape == (64, 128)
    superres = SuperResModel(**SMALL).state_dict()
    assert superres["input_blocks.0.0.weight"].shape == (32, 6, 3, 3)  # doubled in_channels
    for pool, out_keys in {
        "adaptive": {"out.0.weight", "out.3.weight"},
        "spatial": {"out.0.weight", "out.2.weight"},
        "spatial_v2": {"out.0.weight", "out.1.weight", "out.3.weight"},
    }.items():
        encoder_keys = EncoderUNetModel(**dict(SMALL, out_channels=10, pool=pool)).state_dict()
        assert out_keys <= {k for k in encoder_keys if k.startswith("out.")}


def test_strict_load_round_trip(tmp_path: Path) -> None:
    source = UNetModel(**SMALL, use_scale_shift_norm=True, num_classes=3)
    _randomize(source)
    path = tmp_path / "model.pt"
    torch.save(source.state_dict(), path)
    target = UNetModel(**SMALL, use_scale_shift_norm=True, num_classes=3)
    target.load_state_dict(torch.load(path, weights_only=True), strict=True)
    x, t = _inputs()
    y = torch.tensor([0, 2])
    source.eval()
    target.eval()
    torch.testing.assert_close(target(x, t, y), source(x, t, y), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# Shapes for every option
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"out_channels": 3},
        {"use_scale_shift_norm": True},
        {"resblock_updown": True},
        {"use_new_attention_order": True, "num_heads": 4},
        {"num_head_channels": 16},
        {"num_heads": 2, "num_heads_upsample": 1},
        {"conv_resample": False},
        {"channel_mult": (1, 1, 2), "attention_resolutions": (2, 4)},
        {"dropout": 0.1},
        {"use_checkpoint": True},
    ],
)
def test_unet_option_output_depends_on_its_own_sample_and_timestep(options: dict) -> None:
    # Randomised weights: the zero-initialised output conv would make every output 0.
    model = UNetModel(**{**SMALL, **options}).eval()
    _randomize(model)
    x, t = _inputs()
    with torch.no_grad():
        out = model(x, t)
        assert out.shape == (2, model.out_channels, 16, 16) and out.dtype == torch.float32
        # Another image in slot 1 changes row 1 only; another timestep in slot 0, row 0 only.
        other_x = model(torch.cat([x[:1], torch.randn(1, 3, 16, 16)]), t)
        other_t = model(x, torch.tensor([250.0, t[1].item()]))
    torch.testing.assert_close(other_x[0], out[0])
    assert not torch.allclose(other_x[1], out[1])
    torch.testing.assert_close(other_t[1], out[1])
    assert not torch.allclose(other_t[0], out[0])


def test_grayscale_and_class_conditional() -> None:
    model = UNetModel(**dict(SMALL, in_channels=1, out_channels=2, num_classes=7))
    _randomize(model)
    x, t = _inputs(channels=1)
    out_a = model(x, t, torch.tensor([0, 6]))
    out_b = model(x, t, torch.tensor([1, 6]))
    assert out_a.shape == (2, 2, 16, 16)
    assert not torch.allclose(out_a[0], out_b[0])  # the label changes the output
    torch.testing.assert_close(out_a[1], out_b[1])


def test_class_label_required_iff_conditional() -> None:
    x, t = _inputs()
    with pytest.raises(ValueError, match="if and only if"):
        UNetModel(**SMALL, num_classes=3)(x, t)
    with pytest.raises(AssertionError, match="if and only if"):  # the originals assert
        UNetModel(**SMALL)(x, t, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"y must have shape \(2,\)"):
        UNetModel(**SMALL, num_classes=3)(x, t, torch.tensor([0]))


def test_dims_1_and_3() -> None:
    t = torch.tensor([1.0, 400.0])
    # 3-D resampling only touches the inner two dimensions.
    for dims, shape in ((1, (2, 3, 16)), (3, (2, 3, 2, 8, 8))):
        model = UNetModel(**dict(SMALL, dims=dims)).eval()
        _randomize(model)
        x = torch.randn(shape)
        with torch.no_grad():
            out = model(x, t)
            assert out.shape == (2, 6, *shape[2:])
            assert not torch.allclose(model(x, t.flip(0)), out)  # the timestep is used
            assert not torch.allclose(model(x.flip(-1), t), out)  # the input is used


def test_superres_model() -> None:
    model = SuperResModel(**SMALL)
    _randomize(model)
    x, t = _inputs()
    low_res = torch.randn(2, 3, 8, 8)
    out = model(x, t, low_res=low_res)
    assert out.shape == (2, 6, 16, 16)
    # Same as feeding the bilinearly upsampled image to the plain UNet forward.
    upsampled = F.interpolate(low_res, (16, 16), mode="bilinear")
    torch.testing.assert_close(out, UNetModel.forward(model, torch.cat([x, upsampled], 1), t))
    with pytest.raises(ValueError, match="low_res"):
        model(x, t)


@pytest.mark.parametrize("pool", ["adaptive", "attention", "spatial", "spatial_v2"])
def test_encoder_output_shape(pool: str) -> None:
    model = EncoderUNetModel(
        **dict(SMALL, out_channels=10, pool=pool, num_head_channels=32, resblock_updown=True)
    )
    _randomize(model)
    x, t = _inputs()
    out = model(x, t)
    assert out.shape == (2, 10)
    assert torch.isfinite(out).all()
    # Each row is computed from its own image and timestep.
    other = model(torch.cat([x[:1], x[1:].flip(-1)]), t)
    torch.testing.assert_close(other[0], out[0])
    assert not torch.allclose(other[1], out[1])


def test_feature_vectors() -> None:
    model = UNetModel(**SMALL)
    x, t = _inputs()
    feats = model.get_feature_vectors(x, t)
    assert len(feats["down"]) == len(model.input_blocks)
    assert len(feats["up"]) == len(model.output_blocks)
    assert feats["middle"].shape == (2, 64, 8, 8)


# ---------------------------------------------------------------------------------------------
# Numerics
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [1, 6, 7, 32])
def test_timestep_embedding_closed_form(dim: int) -> None:
    timesteps = torch.tensor([0.0, 1.0, 37.5, 999.0])
    emb = timestep_embedding(timesteps, dim)
    assert emb.shape == (4, dim)
    half = dim // 2
    for i in range(half):
        freq = math.exp(-math.log(10000) * i / half)
        for row, step in enumerate(timesteps.tolist()):
            assert emb[row, i].item() == pytest.approx(math.cos(step * freq), abs=1e-4)
            assert emb[row, half + i].item() == pytest.approx(math.sin(step * freq), abs=1e-4)
    if dim % 2:
        assert (emb[:, -1] == 0).all()


def test_timestep_embedding_matches_reference_formula_exactly() -> None:
    timesteps = torch.tensor([3.0, 250.0, 999.0])
    half = 64
    freqs = torch.exp(-math.log(10000) * torch.arange(0, half, dtype=torch.float32) / half)
    args = timesteps[:, None].float() * freqs[None]
    expected = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    torch.testing.assert_close(timestep_embedding(timesteps, 128), expected, rtol=0, atol=0)


def test_group_norm32_computes_in_float32() -> None:
    torch.manual_seed(0)
    norm = GroupNorm32(32, 64)
    x = torch.randn(2, 64, 4, 4) * 50 + 100
    half = norm(x.half())
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.float(), norm(x.half().float()).half().float())


def test_group_norm32_bf16_on_cpu_equals_the_float32_round_trip() -> None:
    # bf16 on CPU skips the casts: the kernel accumulates in fp32 and rounds once on output.
    torch.manual_seed(0)
    norm = GroupNorm32(32, 64)
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)
    x = (torch.randn(4, 64, 8, 8) * 50 + 100).bfloat16().requires_grad_()
    direct = norm(x)
    assert direct.dtype == torch.bfloat16
    round_trip = torch.nn.functional.group_norm(x.float(), 32, norm.weight, norm.bias).bfloat16()
    # At most one bf16 ulp apart (rounding of the same fp32 value computed in another order).
    ulp = torch.finfo(torch.bfloat16).eps * round_trip.float().abs().clamp_min(1.0)
    assert ((direct.float() - round_trip.float()).abs() <= ulp).all()
    grad = torch.randn_like(direct)
    (g_direct,) = torch.autograd.grad(direct, x, grad)
    (g_round_trip,) = torch.autograd.grad(round_trip, x, grad)
    torch.testing.assert_close(g_direct.float(), g_round_trip.float(), rtol=0.02, atol=0.02)


@pytest.mark.parametrize("spatial", [(6,), (5, 7), (2, 3, 4)])
def test_modulated_group_norm_equals_norm_then_scale_shift(spatial: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    norm = GroupNorm32(32, 64)
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)
    x = torch.randn(3, 64, *spatial, requires_grad=True)
    scale = torch.randn(3, 64, requires_grad=True)
    shift = torch.randn(3, 64, requires_grad=True)
    view = (3, 64) + (1,) * len(spatial)
    two_step = norm(x) * (1 + scale.view(view)) + shift.view(view)
    fused = norm.forward_modulated(x, scale, shift)
    torch.testing.assert_close(fused, two_step, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(two_step)
    leaves = [x, scale, shift, norm.weight, norm.bias]
    for g_fused, g_two in zip(
        torch.autograd.grad(fused, leaves, grad),
        torch.autograd.grad(two_step, leaves, grad),
        strict=True,
    ):
        torch.testing.assert_close(g_fused, g_two, rtol=1e-4, atol=1e-4)


def test_modulated_group_norm_in_half_precision() -> None:
    torch.manual_seed(0)
    norm = GroupNorm32(32, 64)
    x = torch.randn(2, 64, 4, 4)
    scale, shift = torch.randn(2, 64), torch.randn(2, 64)
    expected = norm(x) * (1 + scale[..., None, None]) + shift[..., None, None]
    for dtype in (torch.bfloat16, torch.float16):
        out = norm.forward_modulated(x.to(dtype), scale.to(dtype), shift.to(dtype))
        assert out.dtype == dtype
        torch.testing.assert_close(out.float(), expected, rtol=0.02, atol=0.05)


@pytest.mark.parametrize("size", [4, 8, 12])
def test_upsample_decomposition_equals_interpolate_then_conv(size: int) -> None:
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(32, 16, 3, padding=1)
    x = torch.randn(2, 32, size, size + 2, requires_grad=True)
    direct = conv(F.interpolate(x, scale_factor=2, mode="nearest"))
    fused = upsample_nearest2x_conv3x3(x, conv.weight, conv.bias)
    torch.testing.assert_close(fused, direct, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(direct)
    g_direct = torch.autograd.grad(direct, [x, conv.weight], grad)
    g_fused = torch.autograd.grad(fused, [x, conv.weight], grad)
    for a, b in zip(g_fused, g_direct, strict=True):
        # Weight gradients sum thousands of products in a different order: looser tolerance.
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)


def test_zero_initialised_output() -> None:
    model = UNetModel(**SMALL)
    x, t = _inputs()
    assert not model(x, t).any()  # the final conv starts at zero


def test_checkpointed_gradients_equal_plain() -> None:
    options = dict(SMALL, dropout=0.2, use_scale_shift_norm=True)
    plain = UNetModel(**options)
    _randomize(plain)
    checkpointed = UNetModel(**options, use_checkpoint=True)
    checkpointed.load_state_dict(plain.state_dict())
    x, t = _inputs()
    grads = []
    for model in (plain, checkpointed):
        model.train()
        torch.manual_seed(123)  # same dropout masks; checkpoint replays the RNG state
        model(x, t).square().mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-6)


def test_checkpoint_only_while_training_with_grad(monkeypatch: pytest.MonkeyPatch) -> None:
    import raydiff.core.nn_layers as nn_layers

    calls = []
    real_checkpoint = nn_layers.checkpoint

    def counting_checkpoint(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real_checkpoint(*args, **kwargs)

    monkeypatch.setattr(nn_layers, "checkpoint", counting_checkpoint)
    model = UNetModel(**SMALL, use_checkpoint=True)
    _randomize(model)
    plain = UNetModel(**SMALL)
    plain.load_state_dict(model.state_dict())
    x, t = _inputs()
    for training, grad in ((False, False), (False, True), (True, False), (True, True)):
        calls.clear()
        model.train(training)
        plain.train(training)
        with torch.set_grad_enabled(grad):
            out = model(x, t)
            expected = plain(x, t)
        assert bool(calls) == (training and grad), (training, grad)
        torch.testing.assert_close(out, expected)  # dropout is 0: the mode changes nothing else


# ---------------------------------------------------------------------------------------------
# Precision
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_forward_is_finite(dtype: torch.dtype) -> None:
    model = UNetModel(**SMALL, use_scale_shift_norm=True, num_heads=2)
    _randomize(model)
    x, t = _inputs()
    with torch.autocast("cpu", dtype=dtype):
        out = model(x, t)
    assert out.shape == (2, 6, 16, 16)
    assert torch.isfinite(out.float()).all()
    torch.testing.assert_close(out.float(), model(x, t), rtol=0.1, atol=0.1)


def test_convert_to_fp16_and_back() -> None:
    model = UNetModel(**SMALL, use_fp16=True)
    _randomize(model)
    x, t = _inputs()
    reference = model(x, t)
    model.convert_to_fp16()
    assert model.dtype == torch.float16
    assert model.input_blocks[1][0].in_layers[2].weight.dtype == torch.float16
    assert model.input_blocks[1][0].in_layers[0].weight.dtype == torch.float32  # norms stay fp32
    assert model.time_embed[0].weight.dtype == torch.float32
    out = model(x, t)
    assert out.dtype == torch.float32  # cast back to x's dtype
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, reference, rtol=0.05, atol=0.05)
    model.convert_to_fp32()
    assert model.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def test_groupnorm_divisibility_error_names_arguments() -> None:
    with pytest.raises(ValueError, match="divisible by 32") as info:
        UNetModel(**dict(SMALL, model_channels=48))
    message = str(info.value)
    assert "model_channels" in message and "channel_mult" in message and "48" in message
    with pytest.raises(ValueError, match=r"channel_mult\[1\]=1.5 it gives 32 \* 1.5 = 48"):
        UNetModel(**dict(SMALL, channel_mult=(1, 1.5)))


@pytest.mark.parametrize(
    ("options", "pattern"),
    [
        ({"num_head_channels": 24}, r"num_head_channels=24 .* 64 is not divisible"),
        ({"num_heads": 3}, r"num_heads=3 .* divisor"),
        ({"num_heads_upsample": 5}, r"num_heads_upsample=5"),
        ({"attention_resolutions": (16,)}, r"contains 16, but .* downsample rates are \[1, 2\]"),
        ({"image_size": 15}, r"image_size=15 is invalid: must be a positive multiple of 2"),
        ({"dims": 4}, r"dims=4 is invalid: must be 1, 2 or 3"),
        ({"dropout": 1.5}, r"dropout=1.5 is invalid: must be in \[0, 1\)"),
        ({"channel_mult": ()}, r"channel_mult=\(\) is invalid: must list at least one"),
        ({"num_classes": 0}, r"num_classes must be None or a positive int"),
        ({"num_res_blocks": (2, 4)}, r"num_res_blocks=\(2, 4\) is invalid: must be an int"),
    ],
)
def test_validation_errors(options: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        UNetModel(**{**SMALL, **options})


def test_architecture_errors_name_the_argument_and_its_offending_item() -> None:
    with pytest.raises(UNetArgumentError) as info:
        check_unet_architecture(**{**SMALL, "attention_resolutions": (2, 16)})
    error = info.value
    assert (error.argument, error.value, error.item) == ("attention_resolutions", (2, 16), 16)
    assert str(error).startswith("attention_resolutions=(2, 16) is invalid: it contains 16")
    # image_size fixes the resolutions, so it is checked (and named) before attention_resolutions.
    with pytest.raises(UNetArgumentError) as info:
        check_unet_architecture(**{**SMALL, "image_size": 15, "attention_resolutions": (3,)})
    assert info.value.argument == "image_size"
    copy = pickle.loads(pickle.dumps(info.value))  # Ray pickles exceptions raised in workers
    assert (type(copy), str(copy), copy.argument) == (
        UNetArgumentError,
        str(info.value),
        "image_size",
    )


def test_missing_required_argument() -> None:
    with pytest.raises(TypeError, match="attention_resolutions"):
        UNetModel(in_channels=3, model_channels=32, out_channels=3, num_res_blocks=1)


def test_encoder_pool_validation() -> None:
    with pytest.raises(ValueError, match="pool must be one of"):
        EncoderUNetModel(**dict(SMALL, pool="max"))
    with pytest.raises(ValueError, match="num_head_channels"):
        EncoderUNetModel(**dict(SMALL, pool="attention"))
