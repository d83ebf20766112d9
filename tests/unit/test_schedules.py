"""Beta schedules: endpoints, monotonicity and the closed forms of IDDPM eq. 17 / DDPM."""

import math

import numpy as np
import pytest

from raydiff.core import betas_for_alpha_bar, get_named_beta_schedule


@pytest.mark.parametrize("steps", [1, 10, 1000, 4000])
def test_linear_endpoints_scale_with_steps(steps):
    betas = get_named_beta_schedule("linear", steps)
    scale = 1000 / steps
    assert betas.dtype == np.float64 and betas.shape == (steps,)
    assert betas[0] == pytest.approx(scale * 1e-4, rel=1e-12)
    if steps > 1:
        assert betas[-1] == pytest.approx(scale * 0.02, rel=1e-12)
        assert np.all(np.diff(betas) > 0)


@pytest.mark.parametrize("steps", [10, 100, 1000, 4000])
def test_cosine_matches_eq17_and_is_monotone(steps):
    betas = get_named_beta_schedule("cosine", steps)

    def f(t):
        return math.cos((t / steps + 0.008) / 1.008 * math.pi / 2) ** 2

    expected = [min(1 - f(i + 1) / f(i), 0.999) for i in range(steps)]
    np.testing.assert_array_equal(betas, np.array(expected))
    assert betas[-1] == 0.999  # abar reaches 0 at t = T, so the last beta hits the clip
    assert np.all(np.diff(betas) >= 0)
    assert np.all((betas > 0) & (betas <= 0.999))
    # abar_t follows f(t)/f(0) at every step where no clipping happened.
    abar = np.cumprod(1 - betas)
    t = np.arange(1, steps)
    closed = np.array([f(i) / f(0) for i in t])
    np.testing.assert_allclose(abar[:-1], closed, rtol=1e-9)


def test_betas_for_alpha_bar_clip():
    betas = betas_for_alpha_bar(5, lambda t: 1 - t, max_beta=0.5)
    # beta_i = 1 - abar((i+1)/5) / abar(i/5): 0.2, 0.25, 1/3, 0.5, then 1.0 clipped to 0.5
    np.testing.assert_allclose(betas, [0.2, 0.25, 1 / 3, 0.5, 0.5], rtol=1e-12)


def test_unknown_schedule_names_valid_ones():
    with pytest.raises(ValueError, match="linear, cosine"):
        get_named_beta_schedule("sigmoid", 10)


def test_bad_step_count():
    with pytest.raises(ValueError, match="positive integer"):
        get_named_beta_schedule("linear", 0)
