"""space_timesteps rules and SpacedDiffusion equivalences."""

import numpy as np
import pytest
import torch

from raydiff.core import (
    GaussianDiffusion,
    LossType,
    ModelMeanType,
    ModelVarType,
    SpacedDiffusion,
    get_named_beta_schedule,
    space_timesteps,
)


def kwargs(steps=100, schedule="cosine", rescale=True):
    return dict(
        betas=get_named_beta_schedule(schedule, steps),
        model_mean_type=ModelMeanType.EPSILON,
        model_var_type=ModelVarType.LEARNED_RANGE,
        loss_type=LossType.RESCALED_MSE,
        rescale_timesteps=rescale,
    )


@pytest.mark.parametrize("n", [1000, 250, 100, 50, 25, 10])
def test_ddim_counts_use_the_smallest_exact_stride(n):
    steps = space_timesteps(1000, f"ddim{n}")
    assert isinstance(steps, set) and len(steps) == n
    stride = min(s for s in range(1, 1000) if len(range(0, 1000, s)) == n)
    assert steps == set(range(0, 1000, stride))


def test_ddim_impossible_count_is_an_error():
    with pytest.raises(ValueError, match="integer stride"):
        space_timesteps(10, "ddim6")  # strides 1, 2, 3 give 10, 5, 4 steps: never 6


def test_section_rule_matches_hand_computation():
    # T=300 split in 3 sections of 100; counts 10, 15, 20 with round() on a float index.
    steps = sorted(space_timesteps(300, "10,15,20"))
    expected = []
    for start, count in ((0, 10), (100, 15), (200, 20)):
        stride = 99 / (count - 1)
        idx = 0.0
        for _ in range(count):
            expected.append(start + round(idx))
            idx += stride
    assert steps == sorted(set(expected))
    assert steps[0] == 0 and steps[-1] == 299


def test_earlier_sections_take_the_remainder_and_round_is_bankers():
    # T=10 in 3 sections: sizes 4, 3, 3. Section of size 4 with 3 steps: stride 1.5 ->
    # round(0)=0, round(1.5)=2, round(3.0)=3.
    assert sorted(space_timesteps(10, [3, 1, 1])) == [0, 2, 3, 4, 7]
    # Python's round(2.5) == 2 (half to even): size 6, 3 steps -> stride 2.5 -> 0, 2, 5
    assert sorted(space_timesteps(6, "3")) == [0, 2, 5]


def test_bad_respacing_strings():
    with pytest.raises(ValueError, match="comma-separated"):
        space_timesteps(100, "fast")
    with pytest.raises(ValueError, match="cannot take 20 steps"):
        space_timesteps(30, "20,20")


def test_keeping_every_step_equals_the_base_diffusion():
    base = GaussianDiffusion(**kwargs())
    spaced = SpacedDiffusion(use_timesteps=range(100), **kwargs())
    np.testing.assert_allclose(spaced.betas, base.betas, rtol=1e-12)
    np.testing.assert_allclose(spaced.alphas_cumprod, base.alphas_cumprod, rtol=1e-12)
    assert spaced.timestep_map == list(range(100))
    torch.manual_seed(0)
    x0 = torch.rand(3, 3, 4, 4) * 2 - 1
    noise = torch.randn_like(x0)
    t = torch.tensor([0, 50, 99])

    def model(x, tt):
        return torch.cat([torch.tanh(x + tt.float().view(-1, 1, 1, 1) / 1000), torch.sin(x)], 1)

    a = base.training_losses(model, x0, t, noise=noise)
    b = spaced.training_losses(model, x0, t, noise=noise)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-6, atol=1e-6)
    pa = base.p_mean_variance(model, x0, t)
    pb = spaced.p_mean_variance(model, x0, t)
    for key in pa:
        torch.testing.assert_close(pa[key], pb[key], rtol=1e-6, atol=1e-6)


def test_spaced_betas_preserve_marginals_and_map_timesteps():
    base = GaussianDiffusion(**kwargs(rescale=False))
    use = space_timesteps(100, "10")
    spaced = SpacedDiffusion(use_timesteps=use, **kwargs(rescale=False))
    kept = sorted(use)
    np.testing.assert_allclose(spaced.alphas_cumprod, base.alphas_cumprod[kept], rtol=1e-10)
    seen = {}

    def model(x, tt):
        seen["t"] = tt
        return torch.zeros(x.shape[0], 6, *x.shape[2:])

    spaced.p_mean_variance(model, torch.zeros(2, 3, 2, 2), torch.tensor([0, 9]))
    assert seen["t"].tolist() == [kept[0], kept[9]]


def test_spaced_rescale_uses_original_step_count():
    spaced = SpacedDiffusion(use_timesteps=space_timesteps(100, "ddim10"), **kwargs(rescale=True))
    seen = {}

    def model(x, tt):
        seen["t"] = tt
        return torch.zeros(x.shape[0], 6, *x.shape[2:])

    spaced.p_mean_variance(model, torch.zeros(1, 3, 2, 2), torch.tensor([9]))
    torch.testing.assert_close(seen["t"], torch.tensor([90 * 1000.0 / 100]))


def test_out_of_range_use_timesteps():
    with pytest.raises(ValueError, match="subset"):
        SpacedDiffusion(use_timesteps=[0, 100], **kwargs())
