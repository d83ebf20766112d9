"""Timestep samplers: warm-up, unbiased weights, vectorised FIFO update, state round trip."""

import numpy as np
import pytest
import torch

from raydiff.core import (
    GaussianDiffusion,
    LossSecondMomentResampler,
    LossType,
    ModelMeanType,
    ModelVarType,
    UniformSampler,
    create_named_schedule_sampler,
    get_named_beta_schedule,
)
from raydiff.core.timestep_sampler import append_loss_history


def diffusion(steps=20):
    return GaussianDiffusion(
        betas=get_named_beta_schedule("cosine", steps),
        model_mean_type=ModelMeanType.EPSILON,
        model_var_type=ModelVarType.FIXED_LARGE,
        loss_type=LossType.MSE,
    )


def reference_update(history, counts, ts, losses):
    """improved-diffusion's per-element loop, the behaviour to match."""
    history, counts = history.copy(), counts.copy()
    hist_len = history.shape[1]
    for t, loss in zip(ts, losses, strict=True):
        if counts[t] == hist_len:
            history[t, :-1] = history[t, 1:]
            history[t, -1] = loss
        else:
            history[t, counts[t]] = loss
            counts[t] += 1
    return history, counts


def test_vectorised_update_equals_the_sequential_fifo():
    rng = np.random.default_rng(0)
    steps, hist_len = 7, 4
    history = np.zeros((steps, hist_len))
    counts = np.zeros(steps, dtype=np.int64)
    th_hist, th_counts = (
        torch.zeros(steps, hist_len, dtype=torch.float64),
        torch.zeros(steps, dtype=torch.int64),
    )
    for _ in range(30):
        n = int(rng.integers(1, 25))
        ts = rng.integers(0, steps, size=n)
        losses = rng.random(n)
        history, counts = reference_update(history, counts, ts, losses)
        th_hist, th_counts = append_loss_history(
            th_hist, th_counts, ts=torch.from_numpy(ts), losses=torch.from_numpy(losses)
        )
        np.testing.assert_array_equal(th_hist.numpy(), history)
        np.testing.assert_array_equal(th_counts.numpy(), counts)


def test_update_is_pure():
    h, c = torch.zeros(3, 2, dtype=torch.float64), torch.zeros(3, dtype=torch.int64)
    append_loss_history(h, c, ts=torch.tensor([0, 1]), losses=torch.tensor([1.0, 2.0]))
    assert h.abs().sum() == 0 and c.sum() == 0


def test_python_float_lists_stay_float64():
    """improved-diffusion calls ``update_with_all_losses(ts.tolist(), losses.tolist())``: the floats
    must reach the float64 history unrounded (a float list becomes float32 by default)."""
    losses = [1.0 + 1e-9, 0.1, 2.0 / 3.0, 3.0e-7]
    s = LossSecondMomentResampler(diffusion(steps=4), history_per_term=1, uniform_prob=0.0)
    s.update_with_all_losses([0, 1, 2, 3], losses)
    history = s.state_dict()["loss_history"]
    assert history.dtype == torch.float64
    assert history[:, 0].tolist() == losses
    np.testing.assert_allclose(s.weights(), np.array(losses) / sum(losses), rtol=1e-15)
    # the pure update accepts the same lists
    h, c = append_loss_history(
        torch.zeros(4, 1, dtype=torch.float64),
        torch.zeros(4, dtype=torch.int64),
        ts=[0, 1, 2, 3],
        losses=losses,
    )
    assert h[:, 0].tolist() == losses and c.tolist() == [1, 1, 1, 1]


def test_uniform_before_warmup_then_second_moment():
    d = diffusion(steps=5)
    s = LossSecondMomentResampler(d, history_per_term=3)
    np.testing.assert_array_equal(s.weights(), np.ones(5))
    # fill all but one entry of t=4
    s.update_with_all_losses(
        torch.tensor([0, 1, 2, 3] * 3 + [4, 4]), torch.tensor([1.0, 2, 3, 4] * 3 + [5, 5])
    )
    np.testing.assert_array_equal(s.weights(), np.ones(5))
    s.update_with_all_losses(torch.tensor([4]), torch.tensor([5.0]))
    w = s.weights()
    rms = np.array([1.0, 2, 3, 4, 5])
    expected = rms / rms.sum() * (1 - 0.001) + 0.001 / 5
    np.testing.assert_allclose(w, expected, rtol=1e-12)
    assert w.sum() == pytest.approx(1.0)


def test_importance_weights_make_the_objective_unbiased():
    d = diffusion(steps=10)
    s = LossSecondMomentResampler(d, history_per_term=2, seed=3)
    losses_per_t = torch.linspace(0.1, 5.0, 10, dtype=torch.float64)
    s.update_with_all_losses(torch.arange(10).repeat(2), losses_per_t.repeat(2))
    ts, weights = s.sample(200_000, "cpu")
    assert weights.dtype == torch.float32 and ts.dtype == torch.int64
    estimate = (weights.double() * losses_per_t[ts]).mean().item()
    assert estimate == pytest.approx(losses_per_t.mean().item(), rel=0.01)
    # and it really is non-uniform: large-loss steps are drawn more often
    counts = torch.bincount(ts, minlength=10)
    assert counts[9] > 5 * counts[0]


def test_uniform_sampler_weights_are_one():
    s = UniformSampler(diffusion(), seed=0)
    ts, w = s.sample(2000, "cpu")
    assert torch.all(w == 1) and ts.min() >= 0 and ts.max() < 20
    counts = torch.bincount(ts, minlength=20)  # 100 expected per t, binomial sd ~10
    assert counts.min() > 50 and counts.max() < 150


def test_seeded_generator_and_state_round_trip():
    d = diffusion()
    a = LossSecondMomentResampler(d, seed=5)
    a.update_with_all_losses(torch.arange(20).repeat(10), torch.rand(200, dtype=torch.float64))
    a.sample(8, "cpu")
    state = a.state_dict()
    b = LossSecondMomentResampler(d, seed=99)
    b.load_state_dict(state)
    np.testing.assert_array_equal(a.weights(), b.weights())
    ta, wa = a.sample(32, "cpu")
    tb, wb = b.sample(32, "cpu")
    assert torch.equal(ta, tb) and torch.equal(wa, wb)
    # same seed, same draws; the global NumPy RNG is not used
    np.random.seed(0)
    x = LossSecondMomentResampler(d, seed=1).sample(16, "cpu")[0]
    np.random.seed(1)
    y = LossSecondMomentResampler(d, seed=1).sample(16, "cpu")[0]
    assert torch.equal(x, y)


def test_state_from_another_diffusion_is_refused():
    s = LossSecondMomentResampler(diffusion(steps=20))
    with pytest.raises(ValueError, match="diffusion_steps"):
        LossSecondMomentResampler(diffusion(steps=10)).load_state_dict(s.state_dict())


def test_sync_hook_is_used():
    s = LossSecondMomentResampler(diffusion(steps=4), history_per_term=1)
    calls = []

    def sync(ts, losses):
        calls.append(len(ts))
        return torch.cat([ts, torch.tensor([2, 3])]), torch.cat([losses, torch.tensor([1.0, 1.0])])

    s.update_with_local_losses(torch.tensor([0, 1]), torch.tensor([1.0, 1.0]), sync=sync)
    assert calls == [2]
    assert bool((s._loss_counts == 1).all())


def test_named_sampler():
    d = diffusion()
    assert isinstance(create_named_schedule_sampler("uniform", d), UniformSampler)
    assert isinstance(
        create_named_schedule_sampler("loss-second-moment", d), LossSecondMomentResampler
    )
    with pytest.raises(ValueError, match="uniform, loss-second-moment"):
        create_named_schedule_sampler("loss-aware", d)
