"""EDM2's post-hoc EMA math (raydiff.train.posthoc_ema) against the paper's equations, the check
values of the project's reference notes and numbers from EDM2's reference code.

Fixtures marked "edm2" were produced by running the functions of NVlabs/edm2
``training/phema.py`` at commit 4bf8162f601bcc09472ce8a32dd0cbe8889dc8fc (NumPy 64-bit floats,
results printed with ``repr(float(...))``): ``std_to_exp(std)``, ``exp_to_std(exp)``,
``power_function_beta(std, t_next, t_delta)``, ``power_function_correlation(a_ofs, a_std, b_ofs,
b_std)`` and ``solve_posthoc_coefficients(in_ofs, in_std, out_ofs, out_std)``.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from raydiff.train.posthoc_ema import (
    RECONSTRUCTION_ERROR_LIMIT,
    SIGMA_REL_MAX,
    PowerFunctionEMA,
    WeightedSum,
    inner_products,
    power_beta,
    rate_to_sigma_rel,
    reconstruction_coefficients,
    reconstruction_error,
    sigma_rel_to_gamma,
)


def profile_inner_product(t_a, gamma_a, t_b, gamma_b):
    """<p_a, p_b> of two profiles (eq. 151) as a float."""
    return float(inner_products(*(np.float64(x) for x in (t_a, gamma_a, t_b, gamma_b))))


def gamma_to_sigma_rel(gamma):
    """Eq. 123, which sigma_rel_to_gamma inverts."""
    return math.sqrt((gamma + 1) / ((gamma + 2) ** 2 * (gamma + 3)))


def combine(states, coefficients):
    """sum_i coefficients[i] * states[i], as reconstruction forms each target."""
    total = WeightedSum()
    for state, coefficient in zip(states, coefficients, strict=True):
        total.add(state, coefficient)
    return total.result()


# edm2 std_to_exp(std) (eq. 126, algorithm 2); 0.05, 0.10, 0.15 are also the reference notes'.
GAMMAS = {
    0.01: 96.99489782370986,
    0.05: 16.972198602303447,
    0.08: 9.452254965670829,
    0.10: 6.937203937601809,
    0.15: 3.5578687748994646,
    0.25: 0.71982395800071,
    0.28: 0.16934399376949866,
}
# edm2 exp_to_std(exp) (eq. 123).
SIGMA_RELS = {
    0.0: 0.28867513459481287,
    1.0: 0.23570226039551584,
    3.5: 0.15128187169778975,
    100.0: 0.009708271266078407,
}
# edm2 power_function_beta(std, t_next, t_delta) (eq. 127): (sigma_rel, t, dt) -> beta.
BETAS = {
    (0.05, 1000, 1): 0.9821795062966565,  # also the reference notes' check value
    (0.10, 1000, 1): 0.9920902726450789,
    (0.10, 2, 1): 0.004080031659650188,
    (0.15, 37, 1): 0.8826019887033979,
    (0.05, 83886080, 2048): 0.999561316513592,  # 10 x 8 Mi images, batch 2048
    (0.10, 500, 4): 0.9382367296209433,
}
# edm2 power_function_correlation(a_ofs, a_std, b_ofs, b_std) (eq. 151).
INNER_PRODUCTS = {
    (400, 0.05, 800, 0.10): 5.8412928389246274e-05,
    (1000, 0.08, 1000, 0.08): 0.005488687450443878,
    (250, 0.15, 1000, 0.05): 2.3016320380866294e-13,
}
# Snapshots every 100 steps to 1000 of the two default profiles (EDM2's 0.05 and 0.10).
TEN_BY_TWO = [(100.0 * i, sigma_rel) for sigma_rel in (0.05, 0.10) for i in range(1, 11)]


@pytest.mark.parametrize(("sigma_rel", "gamma"), GAMMAS.items())
def test_sigma_rel_to_gamma_is_the_reference_root(sigma_rel, gamma):
    assert sigma_rel_to_gamma(sigma_rel) == pytest.approx(gamma, rel=1e-13)
    # eq. 123 inverts it.
    assert gamma_to_sigma_rel(gamma) == pytest.approx(sigma_rel, rel=1e-13)


@pytest.mark.parametrize(("gamma", "sigma_rel"), SIGMA_RELS.items())
def test_gamma_to_sigma_rel_is_eq_123(gamma, sigma_rel):
    assert gamma_to_sigma_rel(gamma) == pytest.approx(sigma_rel, rel=1e-14)


def test_the_widest_profiles_between_edm2s_cap_and_the_peak_have_a_root_above_minus_one():
    # Eq. 123 peaks at gamma = golden ratio - 2; EDM2's command line stops at 0.289 (gamma 0).
    assert gamma_to_sigma_rel((1 + math.sqrt(5)) / 2 - 2) == pytest.approx(SIGMA_REL_MAX)
    for sigma_rel in (0.289, 0.295, 0.3):
        gamma = sigma_rel_to_gamma(sigma_rel)
        assert -0.382 < gamma < 0  # the larger of the two roots above -1
        assert gamma_to_sigma_rel(gamma) == pytest.approx(sigma_rel, rel=1e-9)


@pytest.mark.parametrize("sigma_rel", [0.0, -0.05, 0.301, 1.0, math.nan, math.inf])
def test_a_sigma_rel_without_a_profile_is_refused_with_the_range(sigma_rel):
    # Past the peak the cubic's largest real part belongs to a complex pair or a root below -1.
    with pytest.raises(ValueError, match=rf"sigma_rel {sigma_rel} .*\(0, 0\.3003\]"):
        sigma_rel_to_gamma(sigma_rel)


@pytest.mark.parametrize(("case", "beta"), BETAS.items())
def test_power_beta_is_eq_127(case, beta):
    sigma_rel, step, dt = case
    gamma = sigma_rel_to_gamma(sigma_rel)
    assert power_beta(gamma=gamma, step=step, dt=dt) == pytest.approx(beta, rel=1e-13)


@pytest.mark.parametrize("sigma_rel", [0.01, 0.05, 0.10, 0.28])
def test_power_beta_is_zero_at_the_first_step(sigma_rel):
    assert power_beta(gamma=sigma_rel_to_gamma(sigma_rel), step=1) == 0.0
    assert power_beta(gamma=sigma_rel_to_gamma(sigma_rel), step=2048, dt=2048) == 0.0


@pytest.mark.parametrize(("step", "dt"), [(0, 1), (-3, 1), (5, 0), (5, 6)])
def test_power_beta_refuses_times_before_the_first_step(step, dt):
    with pytest.raises(ValueError, match=rf"(step {step}|dt {dt}) is invalid"):
        power_beta(gamma=6.9, step=step, dt=dt)


@pytest.mark.parametrize("rate", [0.99, 0.999, 0.9999])
def test_rate_to_sigma_rel_is_the_measured_width_of_the_exponential_profile(rate):
    # improved-diffusion's EMA after `step` updates from the initial weights: weight rate^step on
    # them (time 0) and (1 - rate) rate^(step - tau) on the weights after step tau.
    step = round(30 / (1 - rate))  # step >> 1 / (1 - rate): the initial weights' share is e^-30
    tau = np.arange(step + 1, dtype=np.float64)
    weights = (1 - rate) * rate ** (step - tau)
    weights[0] = rate**step
    assert weights.sum() == pytest.approx(1.0, rel=1e-9)
    mean = (weights * tau).sum()
    measured = math.sqrt((weights * (tau - mean) ** 2).sum()) / step
    assert rate_to_sigma_rel(rate, step=step) == pytest.approx(measured, rel=1e-5)


@pytest.mark.parametrize("rate", [0.0, 1.0, -0.5, 1.5])
def test_rate_to_sigma_rel_refuses_a_rate_outside_0_1(rate):
    with pytest.raises(ValueError, match=rf"rate {rate} is invalid.*\(0, 1\)"):
        rate_to_sigma_rel(rate, step=1000)


@pytest.mark.parametrize(("case", "value"), INNER_PRODUCTS.items())
def test_profile_inner_product_is_eq_151(case, value):
    t_a, s_a, t_b, s_b = case
    gamma_a, gamma_b = sigma_rel_to_gamma(s_a), sigma_rel_to_gamma(s_b)
    assert profile_inner_product(t_a, gamma_a, t_b, gamma_b) == pytest.approx(value, rel=1e-12)
    assert profile_inner_product(t_b, gamma_b, t_a, gamma_a) == pytest.approx(value, rel=1e-12)


def test_profile_inner_product_matches_a_quadrature():
    # <p_a, p_b> with p_t(tau) = (g + 1) tau^g / t^(g + 1) on [0, t] (eq. 121), midpoint rule.
    t_a, g_a, t_b, g_b = 600.0, 3.5, 1000.0, 9.0
    tau = (np.arange(200_000) + 0.5) / 200_000 * t_a
    p_a = (g_a + 1) * tau**g_a / t_a ** (g_a + 1)
    p_b = (g_b + 1) * tau**g_b / t_b ** (g_b + 1)
    quadrature = (p_a * p_b).sum() * t_a / tau.size
    assert profile_inner_product(t_a, g_a, t_b, g_b) == pytest.approx(quadrature, rel=1e-6)


def test_reconstruction_coefficients_check_value_of_the_reference_notes():
    snapshots = [(400, 0.05), (800, 0.05), (400, 0.10), (800, 0.10)]
    coefficients = reconstruction_coefficients(snapshots, [(800, 0.08)])
    assert coefficients.shape == (4, 1) and coefficients.dtype == np.float64
    expected = [0.000183, 0.258129, -0.002505, 0.744193]  # rounded to 1e-6
    np.testing.assert_allclose(coefficients[:, 0], expected, rtol=0, atol=5e-7)


def test_reconstruction_coefficients_match_edm2():
    # edm2 solve_posthoc_coefficients([300, 600, 900] * 2, [0.05] * 3 + [0.10] * 3,
    #                                 [900, 900], [0.03, 0.20])
    expected = [
        [-2.537295581007416e-11, -0.01895707264546101],
        [-0.001461086185823353, -0.13334509549501747],
        [2.1446582974239967, -0.3874931218458417],
        [1.46479920789973e-08, 0.0525853707568622],
        [0.04766008115203274, 0.336606754067181],
        [-1.1908573070128252, 1.150603165162277],
    ]
    snapshots = [(t, s) for s in (0.05, 0.10) for t in (300, 600, 900)]
    coefficients = reconstruction_coefficients(snapshots, [(900, 0.03), (900, 0.20)])
    np.testing.assert_allclose(coefficients, expected, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(coefficients.sum(axis=0), [1.0, 1.0], rtol=1e-12)


def test_reconstruction_coefficients_match_edm2_over_ten_snapshots_per_profile():
    # edm2 solve_posthoc_coefficients(TEN_BY_TWO times, sigma_rels, [1000, 1000], [0.08, 0.15])
    expected_08 = [0.0007703762525206527, 0.19985699050570488, -0.001994477742037463]
    expected_15 = [-0.017547673228363373, -0.15362047608882395, 0.04096990560468395]
    coefficients = reconstruction_coefficients(TEN_BY_TWO, [(1000, 0.08), (1000, 0.15)])
    rows = [5, 9, 15]  # (600, 0.05), (1000, 0.05), (600, 0.10)
    np.testing.assert_allclose(coefficients[rows, 0], expected_08, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(coefficients[rows, 1], expected_15, rtol=1e-8, atol=1e-12)
    assert coefficients[19, 0] == pytest.approx(0.8782878758828053, rel=1e-9)


def test_a_tracked_profile_at_a_snapshot_time_is_that_snapshot():
    coefficients = reconstruction_coefficients(TEN_BY_TWO, TEN_BY_TWO)
    np.testing.assert_allclose(coefficients, np.eye(len(TEN_BY_TWO)), rtol=0, atol=1e-6)
    assert reconstruction_error(TEN_BY_TWO, (700, 0.05)) < 1e-6


def test_reconstruction_refuses_what_it_cannot_reconstruct():
    with pytest.raises(ValueError, match="no snapshots"):
        reconstruction_coefficients([], [(100, 0.05)])
    with pytest.raises(ValueError, match=r"target time 1001.0 is after the last snapshot's.*<= "):
        reconstruction_coefficients(TEN_BY_TWO, [(1001, 0.08)])
    with pytest.raises(ValueError, match=r"\(t=400, sigma_rel=0.05\) is given twice"):
        reconstruction_coefficients([(400, 0.05), (800, 0.05), (400, 0.05)], [(800, 0.08)])
    with pytest.raises(ValueError, match=r"snapshot time 0 .*before the first step"):
        reconstruction_coefficients([(0, 0.05), (800, 0.05)], [(800, 0.08)])
    with pytest.raises(ValueError, match=r"sigma_rel 0.4 has no power-function profile"):
        reconstruction_coefficients(TEN_BY_TWO, [(1000, 0.4)])


def _profile(t: float, sigma_rel: float, tau: np.ndarray) -> np.ndarray:
    gamma = sigma_rel_to_gamma(sigma_rel)
    return np.where(tau <= t, (gamma + 1) * tau**gamma / t ** (gamma + 1), 0.0)  # eq. 121


@pytest.mark.parametrize("sigma_rel", [0.03, 0.08, 0.15])
def test_reconstruction_error_is_the_relative_l2_distance_of_the_profiles(sigma_rel):
    coefficients = reconstruction_coefficients(TEN_BY_TWO, [(1000, sigma_rel)])[:, 0]
    tau = (np.arange(400_000) + 0.5) / 400_000 * 1000  # midpoints over [0, 1000]
    target = _profile(1000, sigma_rel, tau)
    rebuilt = sum(
        c * _profile(t, s, tau) for c, (t, s) in zip(coefficients, TEN_BY_TWO, strict=True)
    )
    measured = np.sqrt(((target - rebuilt) ** 2).sum() / (target**2).sum())
    assert reconstruction_error(TEN_BY_TWO, (1000, sigma_rel)) == pytest.approx(measured, rel=1e-3)


def test_targets_narrower_than_the_narrowest_profile_are_poorly_represented():
    errors = [reconstruction_error(TEN_BY_TWO, (1000, s)) for s in (0.04, 0.03, 0.02, 0.01)]
    assert errors == sorted(errors) and errors[0] > RECONSTRUCTION_ERROR_LIMIT
    assert reconstruction_error(TEN_BY_TWO, (1000, 0.08)) < RECONSTRUCTION_ERROR_LIMIT
    # A target between snapshot times is not (EDM2 reconstructs at a snapshot's time).
    assert reconstruction_error(TEN_BY_TWO, (950, 0.08)) > 0.1


@pytest.mark.parametrize("sigma_rel", [0.05, 0.08, 0.10])
def test_the_error_limit_is_the_distance_to_a_profile_one_to_two_percent_wider(sigma_rel):
    # Why RECONSTRUCTION_ERROR_LIMIT is 1e-2: a reconstruction that close to its target is no
    # further from it than the profile of a sigma_rel 1-2 % off, well inside the broad optimum
    # of EDM2's sweeps over sigma_rel.
    gamma = sigma_rel_to_gamma(sigma_rel)

    def distance(factor: float) -> float:
        other = sigma_rel_to_gamma(sigma_rel * factor)
        own = profile_inner_product(1.0, gamma, 1.0, gamma)
        square = own - 2 * profile_inner_product(1.0, gamma, 1.0, other)
        square += profile_inner_product(1.0, other, 1.0, other)
        return math.sqrt(square / own)

    assert distance(1.01) < RECONSTRUCTION_ERROR_LIMIT < distance(1.02)


class _Net(torch.nn.Module):
    """Parameters and buffers of each kind: float and integer (like BatchNorm's)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.register_buffer("scale", torch.ones(3))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
        self.register_buffer("scratch", torch.zeros(2), persistent=False)


def _walk(module: torch.nn.Module, generator: torch.Generator, size: float = 0.01) -> None:
    """One training step of a random walk of the weights (and a change of the buffers)."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(size * torch.randn(p.shape, generator=generator))
        module.scale.mul_(1.01)
        module.count.add_(1)


def _flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([state["linear.weight"].flatten(), state["linear.bias"]]).double()


def test_the_first_update_makes_every_profile_the_weights():
    torch.manual_seed(0)
    net = _Net()
    ema = PowerFunctionEMA(net, sigma_rels=[0.01, 0.05, 0.28])
    _walk(net, torch.Generator().manual_seed(1), size=1.0)
    ema.update(net, step=1)
    for state in ema.snapshot(dtype=torch.float32).values():
        assert torch.equal(state["linear.weight"], net.linear.weight.detach())
        assert torch.equal(state["linear.bias"], net.linear.bias.detach())


def test_the_tracked_average_has_exactly_the_power_function_profile():
    # eq. 127 makes the weight of the weights after step tau, at time t, the profile's mass on
    # (tau - 1, tau]: (tau^(g+1) - (tau-1)^(g+1)) / t^(g+1) (eq. 121 integrated).
    torch.manual_seed(0)
    net, generator = _Net(), torch.Generator().manual_seed(2)
    ema = PowerFunctionEMA(net, sigma_rels=[0.10])
    trajectory = []
    for step in range(1, 301):
        _walk(net, generator)
        ema.update(net, step=step)
        trajectory.append(_flat(net.state_dict()))
    gamma = sigma_rel_to_gamma(0.10)
    tau = torch.arange(1, 301, dtype=torch.float64)
    weights = (tau ** (gamma + 1) - (tau - 1) ** (gamma + 1)) / 300 ** (gamma + 1)
    exact = (weights[:, None] * torch.stack(trajectory)).sum(0)
    tracked = _flat(ema.snapshot(dtype=torch.float32)["0.100"])
    torch.testing.assert_close(tracked, exact, rtol=0, atol=1e-6)  # float32 rounding only


def test_a_target_between_the_tracked_lengths_is_reconstructed_closely():
    """Random-walk weights, snapshots of 0.05 and 0.10 every 100 steps to 1000; 0.08 rebuilt at
    step 1000 against a directly tracked 0.08.

    Tolerance: the tracked averages are exactly <p, theta> (test above), so the rebuilt weights
    differ from the target's by <p_hat - p, theta - theta_1000> <= ||p_hat - p|| *
    ||theta - theta_1000|| per coordinate (Cauchy-Schwarz; both profiles have mass 1), plus
    float32 rounding (1e-6). And, as EDM2 reports small errors for targets between the tracked
    lengths, it is under 1 % of the distance between the two tracked averages (it is 0.3 %).
    """
    torch.manual_seed(0)
    net, generator = _Net(), torch.Generator().manual_seed(3)
    ema = PowerFunctionEMA(net, sigma_rels=[0.05, 0.10, 0.08])
    snapshots, states, trajectory = [], [], []
    for step in range(1, 1001):
        _walk(net, generator)
        ema.update(net, step=step)
        trajectory.append(_flat(net.state_dict()))
        if step % 100 == 0:
            taken = ema.snapshot(dtype=torch.float32)
            for key in ("0.050", "0.100"):
                snapshots.append((step, float(key)))
                states.append(taken[key])
    coefficients = reconstruction_coefficients(snapshots, [(1000, 0.08)])[:, 0]
    rebuilt = combine(states, coefficients.tolist())
    direct = ema.snapshot(dtype=torch.float32)
    gap = (_flat(rebuilt) - _flat(direct["0.080"])).abs()

    gamma = sigma_rel_to_gamma(0.08)
    profile_distance = reconstruction_error(snapshots, (1000, 0.08)) * math.sqrt(
        profile_inner_product(1000, gamma, 1000, gamma)
    )
    deviation = (torch.stack(trajectory) - trajectory[-1]).square().sum(0).sqrt()
    assert torch.all(gap <= profile_distance * deviation + 1e-6)
    spread = _flat(direct["0.050"]) - _flat(direct["0.100"])
    assert gap.norm() < 0.01 * spread.norm()
    assert torch.equal(rebuilt["count"], direct["0.080"]["count"])  # copied, not averaged


def test_constant_weights_stay_constant_under_update_and_reconstruction():
    torch.manual_seed(0)
    net = _Net()
    ema = PowerFunctionEMA(net, sigma_rels=[0.05, 0.10])
    states = []
    for step in range(1, 101):
        ema.update(net, step=step)
        if step % 10 == 0:
            taken = ema.snapshot(dtype=torch.float32)
            states += [taken["0.050"], taken["0.100"]]
            for state in taken.values():
                assert torch.equal(state["linear.weight"], net.linear.weight.detach())
    snapshots = [(10.0 * i, s) for i in range(1, 11) for s in (0.05, 0.10)]
    for target in [(100, 0.15), (100, 0.03), (50, 0.08)]:
        coefficients = reconstruction_coefficients(snapshots, [target])[:, 0]
        rebuilt = combine(states, coefficients.tolist())
        torch.testing.assert_close(rebuilt["linear.weight"], net.linear.weight.detach())
        torch.testing.assert_close(rebuilt["linear.bias"], net.linear.bias.detach())


def _run(net: torch.nn.Module, ema: PowerFunctionEMA, steps: range, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for step in steps:
        generator.manual_seed(seed + step)  # the same walk whichever step a run starts at
        _walk(net, generator)
        ema.update(net, step=step)


def test_a_resumed_tracker_continues_bit_identically():
    torch.manual_seed(0)
    net = _Net()
    straight = PowerFunctionEMA(net, sigma_rels=[0.05, 0.10])
    _run(net, straight, range(1, 41), seed=7)

    torch.manual_seed(0)
    first_half = _Net()
    tracker = PowerFunctionEMA(first_half, sigma_rels=[0.05, 0.10])
    _run(first_half, tracker, range(1, 21), seed=7)
    buffer = io.BytesIO()
    torch.save({"ema": tracker.state_dict(), "net": first_half.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)

    torch.manual_seed(99)  # a fresh process: other initial weights, overwritten by the state
    resumed_net = _Net()
    resumed_net.load_state_dict(saved["net"])
    resumed = PowerFunctionEMA(resumed_net, sigma_rels=[0.05, 0.10])
    resumed.load_state_dict(saved["ema"])
    assert resumed.step == 20
    _run(resumed_net, resumed, range(21, 41), seed=7)

    for key, state in straight.snapshot(dtype=torch.float32).items():
        resumed_state = resumed.snapshot(dtype=torch.float32)[key]
        assert all(torch.equal(state[name], resumed_state[name]) for name in state)


def test_a_state_of_other_profiles_is_refused():
    net = _Net()
    state = PowerFunctionEMA(net, sigma_rels=[0.05, 0.10]).state_dict()
    with pytest.raises(ValueError, match=r"sigma_rels \[0.05, 0.1\], this tracker \[0.05\]"):
        PowerFunctionEMA(net, sigma_rels=[0.05]).load_state_dict(state)


def test_state_dict_is_a_copy():
    net = _Net()
    ema = PowerFunctionEMA(net, sigma_rels=[0.05])
    state = ema.state_dict()
    _walk(net, torch.Generator().manual_seed(0), size=1.0)
    ema.update(net, step=1)
    assert not torch.equal(state["profiles"]["0.050"]["linear.weight"], net.linear.weight)


def test_snapshot_is_a_cpu_state_dict_per_profile_in_the_dtype():
    torch.manual_seed(0)
    net = _Net()
    ema = PowerFunctionEMA(net, sigma_rels=[0.05, 0.10])
    _walk(net, torch.Generator().manual_seed(0))
    ema.update(net, step=1)
    snapshots = ema.snapshot()
    assert list(snapshots) == ["0.050", "0.100"]
    for state in snapshots.values():
        assert list(state) == list(net.state_dict())  # the persistent buffers, not `scratch`
        assert state["linear.weight"].dtype == torch.float16
        assert state["scale"].dtype == torch.float16 and state["count"].dtype == torch.long
        assert all(tensor.device.type == "cpu" for tensor in state.values())
        assert torch.equal(state["scale"], net.scale.half())
        assert int(state["count"]) == 1
        _Net().load_state_dict(state)  # strict: loads into the model
    live = ema.snapshot(dtype=torch.float32)["0.050"]["linear.weight"]
    live.zero_()  # a copy, even when no conversion was needed
    assert not torch.equal(ema.snapshot(dtype=torch.float32)["0.050"]["linear.weight"], live)


def test_tracker_refuses_bad_profiles_and_steps():
    net = _Net()
    with pytest.raises(ValueError, match="sigma_rels is empty"):
        PowerFunctionEMA(net, sigma_rels=[])
    with pytest.raises(ValueError, match=r"sigma_rel 0.0505 has more than three decimals"):
        PowerFunctionEMA(net, sigma_rels=[0.0505])
    with pytest.raises(ValueError, match="repeat a value"):
        PowerFunctionEMA(net, sigma_rels=[0.05, 0.050])
    with pytest.raises(ValueError, match=r"sigma_rel 0.5 has no power-function profile"):
        PowerFunctionEMA(net, sigma_rels=[0.5])
    ema = PowerFunctionEMA(net, sigma_rels=[0.05])
    with pytest.raises(ValueError, match="step 0 is invalid"):
        ema.update(net, step=0)
    ema.update(net, step=1)
    with pytest.raises(ValueError, match=r"step 1 is invalid: .* after step 1"):
        ema.update(net, step=1)
    with pytest.raises(ValueError, match="the module has 1 parameters, the tracked one 2"):
        ema.update(torch.nn.Linear(2, 2, bias=False), step=2)


def test_weighted_sum_checks_its_inputs():
    a = {"w": torch.ones(2, dtype=torch.float16), "n": torch.tensor(1)}
    b = {"w": torch.full((2,), 3.0), "n": torch.tensor(2)}
    combined = combine([a, b], [0.25, 0.75])
    assert combined["w"].dtype == torch.float32
    torch.testing.assert_close(combined["w"], torch.full((2,), 2.5))
    assert int(combined["n"]) == 2  # an integer buffer comes from the last snapshot
    with pytest.raises(ValueError, match=r"other keys than state dict 0 \(e.g. \['x'\]\)"):
        combine([a, {"w": b["w"], "n": b["n"], "x": b["w"]}], [0.5, 0.5])
    with pytest.raises(ValueError, match=r"'w' has shape \(3,\) in state dict 1"):
        combine([a, {"w": torch.ones(3), "n": b["n"]}], [0.5, 0.5])
    with pytest.raises(ValueError, match="no state dicts"):
        combine([], [])
