"""``raydiff sample --precision``: the model's forward autocast, the sampler's arithmetic in fp32,
samples close to fp32's and still a function of (seed, index); the flag's values checked."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_classifier_guidance import tiny_classifier
from tiny_model import tiny_unet

from raydiff.config import DiffusionConfig
from raydiff.core import SuperResModel
from raydiff.errors import ConfigError
from raydiff.factory import create_gaussian_diffusion
from raydiff.sample.classifier import classifier_cond_fn
from raydiff.sample.generate import generate, sampling_precision
from raydiff.sample.options import SampleOptions, cascade_stages
from raydiff.train.precision import autocast_model

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")


def pixel_difference(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference of two uint8 sample sets, in levels of 255."""
    return float(np.abs(a.astype(int) - b.astype(int)).mean())


@pytest.mark.parametrize("respacing,use_ddim", [("10", False), ("ddim10", True)])
def test_bf16_samples_are_close_to_fp32_and_depend_on_seed_and_index(respacing, use_ddim):
    model = tiny_unet()
    diffusion = create_gaussian_diffusion(
        DiffusionConfig(diffusion_steps=100, timestep_respacing=respacing)
    )

    def run(precision: str, indices: range = range(8)) -> np.ndarray:
        return generate(
            model,
            diffusion,
            indices=indices,
            image_shape=(1, 8, 8),
            seed=3,
            use_ddim=use_ddim,
            precision=precision,
        )

    fp32, bf16 = run("fp32"), run("bf16")
    # Autocast acted (other pixels), within rounding of the fp32 samples: two different
    # samples of this model differ by ~100 levels on average.
    assert (bf16 != fp32).any()
    assert pixel_difference(bf16, fp32) < 2.0
    np.testing.assert_array_equal(run("auto"), fp32)  # auto is fp32 on a CPU
    # The same batch again gives the same bytes; other batch companions the same samples up to
    # the rounding of other batch shapes.
    np.testing.assert_array_equal(run("bf16"), bf16)
    halves = np.concatenate([run("bf16", range(0, 4)), run("bf16", range(4, 8))])
    assert np.abs(halves.astype(int) - bf16.astype(int)).max() <= 1


def test_the_model_autocasts_and_the_sampler_gets_fp32():
    model = tiny_unet()
    seen = []
    model.out.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    x, t = torch.randn(2, 1, 8, 8), torch.tensor([3, 7])
    output = autocast_model(model, "bf16", device=CPU)(x, t)
    assert seen == [torch.bfloat16] and output.dtype == torch.float32
    torch.testing.assert_close(output, model(x, t), atol=0.05, rtol=0.05)
    assert autocast_model(model, "fp32", device=CPU) is model
    with pytest.raises(ValueError, match=r"precision 'auto' is invalid; valid: fp32, bf16, fp16"):
        autocast_model(model, "auto", device=CPU)  # resolved values only


def test_guidance_keeps_its_gradient_in_fp32_under_autocast():
    """The classifier's gradient is taken outside the model's autocast (in fp32): the guided
    bf16 samples are close to the guided fp32 ones, and guidance still moves them."""
    _, classifier = tiny_classifier()
    guide = classifier_cond_fn(classifier, scale=20.0)
    calls = []

    def cond_fn(x, t, y=None):
        calls.append((torch.is_autocast_enabled("cpu"), x.dtype))
        return guide(x, t, y=y)

    model = tiny_unet()
    diffusion = create_gaussian_diffusion(
        DiffusionConfig(diffusion_steps=40, noise_schedule="cosine", timestep_respacing="10")
    )
    labels = np.array([0, 1, 2, 3])

    def run(precision: str, guided: bool = True) -> np.ndarray:
        return generate(
            model,
            diffusion,
            indices=range(4),
            image_shape=(1, 8, 8),
            seed=0,
            labels=labels,
            cond_fn=cond_fn if guided else None,
            precision=precision,
        )

    fp32, bf16 = run("fp32"), run("bf16")
    assert calls and set(calls) == {(False, torch.float32)}
    assert pixel_difference(bf16, fp32) < 2.0
    assert pixel_difference(run("bf16", guided=False), bf16) > 2.0


def test_an_upsampler_samples_under_autocast():
    model = tiny_unet(network=SuperResModel)
    diffusion = create_gaussian_diffusion(
        DiffusionConfig(diffusion_steps=50, timestep_respacing="ddim10")
    )
    low_res = torch.linspace(-1, 1, 4 * 16).reshape(4, 1, 4, 4)

    def run(precision: str, images: torch.Tensor = low_res) -> np.ndarray:
        return generate(
            model,
            diffusion,
            indices=range(4),
            image_shape=(1, 8, 8),
            seed=0,
            use_ddim=True,
            low_res=images,
            precision=precision,
        )

    bf16 = run("bf16")
    assert (bf16 != run("fp32")).any() and pixel_difference(bf16, run("fp32")) < 2.0
    assert pixel_difference(run("bf16", -low_res), bf16) > 2.0  # the input still conditions


def test_auto_is_fp32_on_a_cpu_and_bf16_or_fp16_on_cuda(monkeypatch):
    assert sampling_precision("auto", device=CPU) == "fp32"
    assert sampling_precision("bf16", device=CPU) == "bf16"
    cuda = torch.device("cuda")
    for supported, expected in [(True, "bf16"), (False, "fp16")]:
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda s=supported: s)
        assert sampling_precision("auto", device=cuda) == expected
    assert sampling_precision("fp16", device=cuda) == "fp16"
    with pytest.raises(ValueError, match=r"'fp16' is invalid on a CPU.*valid there: auto, fp32"):
        sampling_precision("fp16", device=CPU)
    with pytest.raises(ValueError, match=r"'fp8' is invalid; valid: fp32, fp16, bf16, auto"):
        sampling_precision("fp8", device=CPU)


def test_batch_size_zero_searches_the_largest_power_of_two_that_fits():
    from raydiff.sample.generate import auto_batch_limit, largest_fitting_batch

    assert auto_batch_limit(num_samples=10, num_workers=1) == 16
    assert auto_batch_limit(num_samples=10, num_workers=2) == 8
    assert auto_batch_limit(num_samples=1, num_workers=4) == 1
    assert auto_batch_limit(num_samples=50_000, num_workers=8) == 1024
    tried = []

    def fits(batch: int) -> bool:
        tried.append(batch)
        return batch <= 300

    assert largest_fitting_batch(fits, limit=1024) == 256
    assert tried == [1024, 512, 256]
    with pytest.raises(ValueError, match="not even one sample"):
        largest_fitting_batch(lambda batch: False, limit=4)
    common = {"checkpoint": "c", "num_samples": 1, "out": "o"}
    assert SampleOptions(**common, batch_size=0).batch_size == 0
    with pytest.raises(ConfigError, match=r"batch_size=-1 is invalid: must be >= 1, or 0"):
        SampleOptions(**common, batch_size=-1)


def test_the_precision_option_is_checked():
    common = {"checkpoint": "c", "num_samples": 1, "out": "o"}
    assert SampleOptions(**common).precision == "auto"
    with pytest.raises(ConfigError, match=r"sample\.precision='fp8' is invalid: valid: fp32, fp16"):
        SampleOptions(**common, precision="fp8")
    with pytest.raises(ConfigError, match=r"precision='fp16' is invalid: fp16 .* --use-gpu"):
        SampleOptions(**common, precision="fp16")
    gpu = SampleOptions(**common, precision="fp16", use_gpu=True, upsampler="u")
    assert [stage.precision for stage in cascade_stages(gpu)] == ["fp16", "fp16"]
