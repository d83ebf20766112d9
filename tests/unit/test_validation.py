"""The stratified bits/dim estimate: its timesteps, exactness at K = T, unbiasedness, spread;
the val rows each rank evaluates."""

import pytest
import torch
from tiny_model import tiny_model

from raydiff.config import DiffusionConfig, ExperimentConfig, apply_overrides
from raydiff.factory import create_gaussian_diffusion
from raydiff.train.validation import (
    estimate_bpd,
    rank_rows,
    rank_slice,
    stratified_timesteps,
)


def model(x, t, **kwargs):
    tt = t.float().view(-1, 1, 1, 1) / 1000.0
    return torch.cat([torch.tanh(0.5 * x + tt), torch.sin(x)], dim=1)


def diffusion(steps=20):
    return create_gaussian_diffusion(
        DiffusionConfig(diffusion_steps=steps, noise_schedule="cosine", learn_sigma=True)
    )


def test_geometric_strata_and_the_last_step_fixed_by_the_seed():
    b = stratified_timesteps(1000, 10, seed=3)
    assert b.timesteps.shape == b.weights.shape == (10,)
    assert b.weights.sum() == 1000  # the strata tile [0, T)
    # Narrow strata at the start (t = 0 and 1 exactly), the last step on its own.
    assert b.timesteps[:2].tolist() == [0, 1] and b.weights[:2].tolist() == [1, 1]
    assert b.timesteps[-1] == 999 and b.weights[-1] == 1
    assert torch.all(b.weights[1:-1].diff() >= 0)  # widths grow
    again = stratified_timesteps(1000, 10, seed=3)
    assert torch.equal(b.timesteps, again.timesteps)
    assert not torch.equal(b.timesteps, stratified_timesteps(1000, 10, seed=4).timesteps)
    every = stratified_timesteps(20, 20, seed=0)
    assert torch.equal(every.timesteps, torch.arange(20)) and torch.all(every.weights == 1)
    for count in (1, 2, 3, 7):  # any count tiles [0, T) with distinct timesteps
        b = stratified_timesteps(50, count, seed=1)
        assert b.weights.sum() == 50 and len(set(b.timesteps.tolist())) == len(b.timesteps)
        assert len(b.timesteps) <= count


def test_with_every_timestep_it_equals_calc_bpd_loop():
    d = diffusion()
    x = torch.rand(3, 1, 4, 4) * 2 - 1
    totals = estimate_bpd(
        diffusion=d,
        model=model,
        batches=[(x, {})],
        timesteps=stratified_timesteps(20, 20, seed=0),
        seed=5,
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
                timesteps=stratified_timesteps(20, 5, seed=s),
                seed=s,
            )["bpd_sum"]
            for s in range(300)
        ]
    ).float()
    stderr = estimates.std() / len(estimates) ** 0.5
    assert abs(estimates.mean() - exact) < 4 * stderr + 0.02 * exact.abs()


def test_one_large_term_no_longer_decides_the_estimate():
    """A bound whose last term is large (eps-prediction, fixed variance, cosine schedule) made
    the equal-strata estimate swing by ~100x between seeds of the draw; every draw now includes
    t = T-1, and small t sit in narrow strata."""
    per_t = 1.0 / torch.arange(1, 1001, dtype=torch.float64)  # early terms large, ~1/t
    per_t[-1] = 2.0  # and a large last term, as measured on the demo's weights
    exact = per_t.sum()
    estimates = []
    for seed in range(200):
        b = stratified_timesteps(1000, 10, seed=seed)
        estimates.append(float((b.weights * per_t[b.timesteps]).sum()))
    estimates = torch.tensor(estimates)
    assert abs(estimates.mean() - exact) < 0.05 * exact  # unbiased
    assert estimates.std() < 0.1 * exact


def test_each_rank_evaluates_its_slice_of_the_same_rows() -> None:
    # 10 rows in batches of 4 over 3 ranks: rank 1 takes rows 3-5 across a batch edge; the
    # union over ranks is every row, in order.
    x = torch.arange(10).float().reshape(10, 1)
    y = torch.arange(10) + 100
    batches = [{"x": x[i : i + 4], "y": y[i : i + 4]} for i in range(0, 10, 4)]
    slices = [list(rank_slice(batches, rows=rank_rows(10, rank=r, world_size=3))) for r in range(3)]
    rows = [torch.cat([part for part, _ in s]).flatten().tolist() if s else [] for s in slices]
    assert rows == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    labels = torch.cat([cond["y"] for _, cond in slices[1]]).tolist()
    assert labels == [103, 104, 105]
    assert list(rank_slice(batches, rows=range(12, 15))) == []  # past the last row: nothing
    unconditional = [{"x": b["x"]} for b in batches]
    assert all(cond == {} for _, cond in rank_slice(unconditional, rows=range(5)))


def test_val_rows_are_spread_evenly_over_the_ranks() -> None:
    """min(eval_num_images, split size) rows, every one evaluated once, the ranks' shares
    differing by at most one; a rank may get none (fewer images than ranks)."""
    eval_num_images, split = 1000, 150  # more asked for than the split holds
    held = min(eval_num_images, split)
    assert [rank_rows(held, rank=r, world_size=2) for r in range(2)] == [
        range(0, 75),
        range(75, 150),
    ]
    assert [len(rank_rows(3, rank=r, world_size=4)) for r in range(4)] == [0, 1, 1, 1]
    for num_images in range(0, 23):
        for world_size in range(1, 9):
            parts = [
                rank_rows(num_images, rank=r, world_size=world_size) for r in range(world_size)
            ]
            assert [i for part in parts for i in part] == list(range(num_images))
            sizes = [len(part) for part in parts]
            assert max(sizes) - min(sizes) <= 1, (num_images, world_size, sizes)
    with pytest.raises(ValueError, match="rank 2 of 2"):
        rank_rows(10, rank=2, world_size=2)


def test_the_diffusion_task_evaluates_no_images_as_its_zero_totals() -> None:
    """A rank without val images sums the same keys as the others."""
    from raydiff.train.tasks.diffusion import diffusion_task

    config = apply_overrides(
        ExperimentConfig(),
        [*tiny_model(image_size=8), "diffusion.diffusion_steps=40", "train.eval_timesteps=3"],
    )
    task = diffusion_task(config, runtime=None)  # a diffusion model needs nothing of a runtime
    with torch.no_grad():
        some = task.evaluate(task.model.eval(), [(torch.zeros(2, 1, 8, 8), {})], seed=0)
        none = task.evaluate(task.model, [], seed=0)
    assert set(none) == set(some) and all(float(v) == 0 for v in none.values())
    assert float(some["count"]) == 2
