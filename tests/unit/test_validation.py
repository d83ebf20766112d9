"""The stratified bits/dim estimate: its timesteps, exactness at K = T, unbiasedness."""

import torch

from raydiff.config import DiffusionConfig
from raydiff.core import create_gaussian_diffusion
from raydiff.train.validation import estimate_bpd, stratified_timesteps


def model(x, t, **kwargs):
    tt = t.float().view(-1, 1, 1, 1) / 1000.0
    return torch.cat([torch.tanh(0.5 * x + tt), torch.sin(x)], dim=1)


def diffusion(steps=20):
    return create_gaussian_diffusion(
        DiffusionConfig(diffusion_steps=steps, noise_schedule="cosine", learn_sigma=True)
    )


def test_one_timestep_per_stratum_fixed_by_the_seed():
    t = stratified_timesteps(1000, 10, seed=3)
    assert t.shape == (10,)
    assert all(100 * k <= int(t[k]) < 100 * (k + 1) for k in range(10))
    assert torch.equal(t, stratified_timesteps(1000, 10, seed=3))
    assert not torch.equal(t, stratified_timesteps(1000, 10, seed=4))
    assert torch.equal(stratified_timesteps(20, 20, seed=0), torch.arange(20))


def test_with_every_timestep_it_equals_calc_bpd_loop():
    d = diffusion()
    x = torch.rand(3, 1, 4, 4) * 2 - 1
    totals = estimate_bpd(
        diffusion=d, model=model, batches=[(x, {})], timesteps=torch.arange(20), seed=5
    )
    exact = d.calc_bpd_loop(
        model, x, clip_denoised=False, generator=torch.Generator().manual_seed(5)
    )
    torch.testing.assert_close(
        totals["bpd_sum"].float(), exact["total_bpd"].sum(), rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(
        totals["mse_sum"].float(), exact["mse"].mean(1).sum(), rtol=1e-5, atol=1e-6
    )
    assert totals["count"] == 3


def test_unbiased_over_the_draw_of_the_strata():
    d = diffusion()
    x = torch.rand(2, 1, 4, 4) * 2 - 1
    # Exact bound: average many noise draws of the full loop; the estimate: many stratum draws.
    exact = torch.stack(
        [
            d.calc_bpd_loop(
                model, x, clip_denoised=False, generator=torch.Generator().manual_seed(s)
            )["total_bpd"].sum()
            for s in range(20)
        ]
    ).mean()
    estimates = torch.stack(
        [
            estimate_bpd(
                diffusion=d,
                model=model,
                batches=[(x, {})],
                timesteps=stratified_timesteps(20, 4, seed=s),
                seed=s,
            )["bpd_sum"]
            for s in range(300)
        ]
    ).float()
    stderr = estimates.std() / len(estimates) ** 0.5
    assert abs(estimates.mean() - exact) < 4 * stderr + 0.02 * exact.abs()
