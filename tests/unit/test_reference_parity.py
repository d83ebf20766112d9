"""Parity of raydiff.core with openai/improved-diffusion and openai/guided-diffusion.

The expected values were computed by the reference code itself
(``bench/make_reference_fixtures.py --reference-root .reference``) and frozen into
``fixtures/reference_values.npz``; CI has no copy of the reference. Every fixture *case* becomes
one test id ``kind:name`` and every failure names the output that differs, with the worst element.

Tolerances, and why:
- float64 schedule arrays, respaced betas, timestep maps and timestep sets: bit-exact. The same
  float64 formulas in the same order give the same bits; anything else changes the model's inputs.
  Except the arrays that go through ``np.log`` (``LIBM_LOG_ARRAYS``): NumPy picks its float64 log
  kernel by CPU (AVX-512 or not), and the two differ by 1 ulp on a few elements, for the reference
  itself as much as for raydiff. Those are compared to within 2 ulp.
- float32 tensors: ``rtol=1e-5, atol=1e-6``. Bit equality is not required because raydiff may
  precompute coefficient products in float64 or fuse elementwise ops, which moves a result by a few
  float32 ulps (ulp = 6e-8 relative); 1e-5 allows ~100 ulps of accumulated difference and nothing
  of semantic size. ``atol=1e-6`` only matters for entries near zero (posterior means after
  cancellation, KL terms at small t), where a relative bound is meaningless; 1e-6 is ~10 ulps
  of the O(1) terms being cancelled.
- Decoder NLL (the t == 0 vb term) and anything summing it (``total_bpd``): ``rtol=1e-3``, the
  project's accepted tolerance: log of a difference of two nearly equal CDF values amplifies
  ulp-level differences in the tanh approximation.
- UNet outputs: ``rtol=atol=1e-5`` on O(1) outputs of a ~20-layer float32 network whose
  convolution/attention kernels may sum in a different order than the reference's einsum.
- Loss-second-moment weights: float64, ``rtol=1e-12``.

Across CPUs: torch picks its vectorised ``tanh``/``sin``/``exp`` kernels by CPU (AVX-512, AVX2,
...), and they differ by an ulp, like NumPy's ``log``. So the stand-ins' fingerprints are compared
to within 2 ulp of their O(1) outputs (``STANDIN``), the timestep embedding to within one ulp of its
largest argument (``t * freq`` reaches 999, where a float32 ulp is 6e-5, and one ulp of a frequency
moves it by as much), and a ``RESCALED_KL`` loss, the KL times ``num_timesteps``, with ``F32``'s
``atol`` times ``num_timesteps``: the same cancellation error of the unscaled KL, scaled.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

FIXTURE = Path(__file__).parent / "fixtures" / "reference_values.npz"
_DATA = np.load(FIXTURE)
ARRAYS: dict[str, np.ndarray] = {k: _DATA[k] for k in _DATA.files if k != "__meta__"}
META: dict[str, Any] = json.loads(bytes(_DATA["__meta__"]).decode())
CASES: list[dict[str, Any]] = META["cases"]

F32 = {"rtol": 1e-5, "atol": 1e-6}
DECODER = {"rtol": 1e-3, "atol": 1e-6}
UNET = {"rtol": 1e-5, "atol": 1e-5}
STANDIN = {"rtol": 0.0, "atol": 2.0**-22}  # 2 ulp of values in [1, 2)
EXACT = {"exact": True}

pytestmark = pytest.mark.unit


# ----------------------------------------------------------------------------------------------
# Copies of the stand-ins in bench/make_reference_fixtures.py: must stay identical (checked by
# test_shared_standins_match_fixture).
# ----------------------------------------------------------------------------------------------


def fake_model(learn_sigma: bool) -> Callable[..., torch.Tensor]:
    """A fixed smooth function of (x, t) standing in for a trained network.

    It uses ``t`` (so timestep mapping/rescaling matters) and returns 2C channels when the
    variance is learned; the variance half lies in (-1, 1), the LEARNED_RANGE domain.
    """

    def model(x: torch.Tensor, t: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        tt = t.float().view(-1, *([1] * (x.dim() - 1)))
        mean = torch.tanh(0.8 * x - 0.0007 * tt) + 0.1 * torch.sin(2.0 * x + 0.003 * tt)
        if not learn_sigma:
            return mean
        var = torch.tanh(0.6 * x + 0.0011 * tt - 0.2)
        return torch.cat([mean, var], dim=1)

    return model


def cond_fn(x: torch.Tensor, t: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """A fixed stand-in for a classifier gradient grad_x log p(y | x_t)."""
    return -0.3 * x + 0.0005 * t.float().view(-1, *([1] * (x.dim() - 1)))


def deterministic_weights(shapes: Iterable[tuple[str, tuple[int, ...]]]) -> dict[str, torch.Tensor]:
    """Seeded non-zero weights for every state-dict entry (re-randomises zero-initialised layers).

    Each tensor is drawn from its own generator seeded by the CRC32 of its key, so the result
    depends only on (key, shape), not on module construction order.
    """
    out: dict[str, torch.Tensor] = {}
    for key, shape in shapes:
        gen = torch.Generator().manual_seed(zlib.crc32(key.encode()))
        w = torch.randn(tuple(shape), generator=gen, dtype=torch.float32)
        if len(shape) >= 2:
            w = w / math.sqrt(math.prod(shape[1:]))  # fan-in scaling keeps activations O(1)
        elif key.endswith("weight"):
            w = 1.0 + 0.1 * w  # normalisation scales
        else:
            w = 0.1 * w  # biases
        out[key] = w
    return out


# ----------------------------------------------------------------------------------------------


def core() -> Any:
    """raydiff.core, imported lazily so a broken import fails tests, not collection."""
    import raydiff.core

    return raydiff.core


def build_diffusion(lib: Any, spec: dict[str, Any]) -> Any:
    """Build a (Spaced)GaussianDiffusion from a fixture spec (same as the fixture script)."""
    betas = lib.get_named_beta_schedule(spec["schedule"], spec["T"])
    kwargs = dict(
        betas=betas,
        model_mean_type=lib.ModelMeanType[spec["mean"]],
        model_var_type=lib.ModelVarType[spec["var"]],
        loss_type=lib.LossType[spec["loss"]],
        rescale_timesteps=spec["rescale"],
    )
    if spec.get("respacing"):
        return lib.SpacedDiffusion(
            use_timesteps=lib.space_timesteps(spec["T"], spec["respacing"]), **kwargs
        )
    return lib.GaussianDiffusion(**kwargs)


def learns_sigma(spec: dict[str, Any]) -> bool:
    """True when the model must output 2C channels."""
    return spec["var"] in ("LEARNED", "LEARNED_RANGE")


def tensor(key: str) -> torch.Tensor:
    """A fixture array as a fresh tensor (copied, so in-place ops cannot corrupt ARRAYS)."""
    return torch.from_numpy(ARRAYS[key].copy())


def to_numpy(value: Any) -> np.ndarray:
    """Tensor / array / list to a NumPy array."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def assert_close(
    case: str, name: str, actual: Any, expected: np.ndarray, tol: dict[str, Any]
) -> None:
    """Compare one output, with a message naming the quantity and the worst element."""
    actual = to_numpy(actual)
    label = f"[{case}] {name}"
    assert actual.shape == expected.shape, (
        f"{label}: shape {actual.shape} != reference {expected.shape}"
    )
    if tol.get("exact"):
        if not np.array_equal(actual, expected):
            bad = np.flatnonzero(actual.ravel() != expected.ravel())
            i = int(bad[0])
            raise AssertionError(
                f"{label}: not bit-exact at {bad.size} of {expected.size} elements; first at flat "
                f"index {i}: raydiff {actual.ravel()[i]!r} vs reference {expected.ravel()[i]!r}"
            )
        return
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    if np.allclose(a, e, rtol=tol["rtol"], atol=tol["atol"], equal_nan=False):
        return
    err = np.abs(a - e)
    excess = err - (tol["atol"] + tol["rtol"] * np.abs(e))
    i = int(np.nanargmax(np.where(np.isnan(excess), np.inf, excess)))
    idx = np.unravel_index(i, e.shape)
    n_bad = int(np.sum(~np.isclose(a, e, rtol=tol["rtol"], atol=tol["atol"])))
    raise AssertionError(
        f"{label}: {n_bad}/{e.size} elements outside rtol={tol['rtol']} atol={tol['atol']}; worst at "
        f"{tuple(int(j) for j in idx)}: raydiff {a[idx]:.9g} vs reference {e[idx]:.9g} "
        f"(abs {err[idx]:.3g}, rel {err[idx] / max(abs(e[idx]), 1e-30):.3g}); max abs diff {np.nanmax(err):.3g}"
    )


def check_outputs(
    case: dict[str, Any], actual: dict[str, Any], tols: dict[str, dict[str, Any]] | None = None
) -> None:
    """Compare every expected output of a case; missing outputs fail by name."""
    tols = tols or {}
    missing = sorted(set(case["outputs"]) - set(actual))
    extra = sorted(set(actual) - set(case["outputs"]))
    assert not missing, f"[{case['name']}] raydiff did not return {missing}"
    assert not extra or case["kind"] not in ("training_losses",), (
        f"[{case['name']}] raydiff returned keys the reference does not: {extra}"
    )
    for out_name, key in case["outputs"].items():
        assert_close(case["name"], out_name, actual[out_name], ARRAYS[key], tols.get(out_name, F32))


# ------------------------------------------------------------------------------- case kinds


LIBM_LOG_ARRAYS = frozenset({"log_one_minus_alphas_cumprod", "posterior_log_variance_clipped"})
"""Schedule arrays computed with ``np.log``, whose last bit depends on the CPU (module docstring)."""


def run_schedule(case: dict[str, Any]) -> None:
    import hashlib

    diff = build_diffusion(
        core(),
        {
            "schedule": case["schedule"],
            "T": case["T"],
            "mean": "EPSILON",
            "var": "FIXED_LARGE",
            "loss": "MSE",
            "rescale": False,
        },
    )
    for attr, key in case["outputs"].items():
        arr = np.asarray(getattr(diff, attr))
        assert arr.dtype == np.float64, f"[{case['name']}] {attr} is {arr.dtype}, reference float64"
        if attr in LIBM_LOG_ARRAYS:
            strided = arr[::37] if key.endswith("@strided") else arr
            np.testing.assert_array_max_ulp(strided, ARRAYS[key], maxulp=2)
        elif key.endswith("@strided"):
            assert_close(case["name"], attr + "[::37]", arr[::37], ARRAYS[key], EXACT)
            digest = hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()
            assert digest == case["sha256"][attr], (
                f"[{case['name']}] {attr}: not bit-exact (sha256 differs)"
            )
        else:
            assert_close(case["name"], attr, arr, ARRAYS[key], EXACT)


def run_q(case: dict[str, Any]) -> None:
    diff = build_diffusion(core(), case["spec"])
    x0, noise, t = tensor("in/x_start"), tensor("in/noise"), tensor(case["t"])
    x_t = diff.q_sample(x0, t, noise=noise)
    mean, var, logvar = diff.q_mean_variance(x0, t)
    # The posterior is evaluated at the reference's x_t so that its check is independent of q_sample's.
    pmean, pvar, plogvar = diff.q_posterior_mean_variance(
        x0, tensor(case["outputs"]["q_sample"]), t
    )
    check_outputs(
        case,
        {
            "q_sample": x_t,
            "q_mean": mean,
            "q_variance": var,
            "q_log_variance": logvar,
            "posterior_mean": pmean,
            "posterior_variance": pvar,
            "posterior_log_variance_clipped": plogvar,
        },
    )


def run_p_mean_variance(case: dict[str, Any]) -> None:
    spec = case["spec"]
    diff = build_diffusion(core(), spec)
    out = diff.p_mean_variance(
        fake_model(learns_sigma(spec)),
        tensor(case["x"]),
        tensor(case["t"]),
        clip_denoised=case["clip_denoised"],
    )
    check_outputs(case, out)


def decoder_tolerant(
    case: dict[str, Any], t: torch.Tensor, name: str, actual: torch.Tensor
) -> None:
    """Compare per-sample values: t == 0 entries (decoder NLL) at rtol 1e-3, the rest at F32."""
    expected = ARRAYS[case["outputs"][name]]
    act = to_numpy(actual)
    assert act.shape == expected.shape, (
        f"[{case['name']}] {name}: shape {act.shape} != {expected.shape}"
    )
    is_t0 = to_numpy(t) == 0
    spec = case["spec"]
    scale = spec["T"] if spec["loss"] == "RESCALED_KL" and name == "loss" else 1
    tol = {"rtol": F32["rtol"], "atol": F32["atol"] * scale}
    assert_close(case["name"], f"{name}[t!=0]", act[~is_t0], expected[~is_t0], tol)
    assert_close(case["name"], f"{name}[t==0] (decoder NLL)", act[is_t0], expected[is_t0], DECODER)


def run_training_losses(case: dict[str, Any]) -> None:
    spec = case["spec"]
    diff = build_diffusion(core(), spec)
    t = tensor(case["t"])
    terms = diff.training_losses(
        fake_model(learns_sigma(spec)), tensor("in/x_start"), t, noise=tensor("in/noise")
    )
    assert set(terms) >= set(case["outputs"]), (
        f"[{case['name']}] raydiff returned {sorted(terms)}, reference {sorted(case['outputs'])}"
    )
    for name in case["outputs"]:
        decoder_tolerant(case, t, name, terms[name])


def run_normal_kl(case: dict[str, Any]) -> None:
    m1, lv1, m2, lv2 = (tensor(k) for k in case["inputs"])
    check_outputs(case, {"kl": core().normal_kl(m1, lv1, m2, lv2)})


def run_normal_kl_prior(case: dict[str, Any]) -> None:
    m1, lv1 = (tensor(k) for k in case["inputs"])
    check_outputs(case, {"kl": core().normal_kl(m1, lv1, 0.0, 0.0)})


def run_decoder_nll(case: dict[str, Any]) -> None:
    ll = core().discretized_gaussian_log_likelihood(
        tensor(case["x"]), means=tensor(case["means"]), log_scales=tensor(case["log_scales"])
    )
    check_outputs(case, {"log_probs": ll}, {"log_probs": DECODER})


def run_space_timesteps(case: dict[str, Any]) -> None:
    steps = core().space_timesteps(case["T"], case["counts"])
    assert isinstance(steps, set), (
        f"[{case['name']}] space_timesteps returned {type(steps).__name__}, reference returns a set"
    )
    check_outputs(case, {"steps": np.array(sorted(steps), dtype=np.int64)}, {"steps": EXACT})


def run_space_timesteps_error(case: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        core().space_timesteps(case["T"], case["counts"])


def run_spaced_diffusion(case: dict[str, Any]) -> None:
    diff = build_diffusion(core(), case["spec"])
    check_outputs(
        case,
        {
            "betas": np.asarray(diff.betas),
            "timestep_map": np.asarray(diff.timestep_map, dtype=np.int64),
            "alphas_cumprod": np.asarray(diff.alphas_cumprod),
        },
        {"betas": EXACT, "timestep_map": EXACT, "alphas_cumprod": EXACT},
    )


def run_p_sample(case: dict[str, Any]) -> None:
    diff = build_diffusion(core(), case["spec"])
    torch.manual_seed(case["seed"])
    check_outputs(
        case,
        diff.p_sample(fake_model(learns_sigma(case["spec"])), tensor(case["x"]), tensor(case["t"])),
    )


def run_ddim_sample(case: dict[str, Any]) -> None:
    diff = build_diffusion(core(), case["spec"])
    torch.manual_seed(case["seed"])
    check_outputs(
        case,
        diff.ddim_sample(
            fake_model(learns_sigma(case["spec"])),
            tensor(case["x"]),
            tensor(case["t"]),
            eta=case["eta"],
        ),
    )


def run_ddim_reverse_sample(case: dict[str, Any]) -> None:
    diff = build_diffusion(core(), case["spec"])
    check_outputs(
        case,
        diff.ddim_reverse_sample(
            fake_model(learns_sigma(case["spec"])), tensor(case["x"]), tensor(case["t"])
        ),
    )


def run_p_sample_loop(case: dict[str, Any]) -> None:
    diff = build_diffusion(core(), case["spec"])
    torch.manual_seed(case["seed"])
    out = diff.p_sample_loop(fake_model(learns_sigma(case["spec"])), case["shape"], device="cpu")
    check_outputs(case, {"sample": out})


def run_ddim_sample_loop(case: dict[str, Any]) -> None:
    diff = build_diffusion(core(), case["spec"])
    torch.manual_seed(case["seed"])
    noise = tensor(case["noise"]) if "noise" in case else None
    out = diff.ddim_sample_loop(
        fake_model(learns_sigma(case["spec"])),
        case["shape"],
        noise=noise,
        device="cpu",
        eta=case["eta"],
    )
    check_outputs(case, {"sample": out})


def run_calc_bpd_loop(case: dict[str, Any]) -> None:
    diff = build_diffusion(core(), case["spec"])
    torch.manual_seed(case["seed"])
    out = diff.calc_bpd_loop(
        fake_model(learns_sigma(case["spec"])),
        tensor(case["x"])[: case["batch"]],
        clip_denoised=True,
    )
    # Column order: t = T-1 ... 0, so the decoder NLL is the last vb column.
    vb = to_numpy(out["vb"])
    assert_close(case["name"], "vb[:, t>0]", vb[:, :-1], ARRAYS[case["outputs"]["vb"]][:, :-1], F32)
    assert_close(
        case["name"],
        "vb[:, t==0] (decoder NLL)",
        vb[:, -1],
        ARRAYS[case["outputs"]["vb"]][:, -1],
        DECODER,
    )
    rest = {k: v for k, v in out.items() if k != "vb"}
    rest["vb"] = ARRAYS[case["outputs"]["vb"]]  # checked above
    check_outputs(case, rest, {"total_bpd": DECODER})


def run_condition(case: dict[str, Any]) -> None:
    spec = case["spec"]
    diff = build_diffusion(core(), spec)
    x, t = tensor(case["x"]), tensor(case["t"])
    pmv = diff.p_mean_variance(fake_model(learns_sigma(spec)), x, t)
    cm = diff.condition_mean(cond_fn, pmv, x, t, model_kwargs={})
    cs = diff.condition_score(cond_fn, pmv, x, t, model_kwargs={})
    check_outputs(
        case,
        {
            "condition_mean": cm,
            "condition_score_mean": cs["mean"],
            "condition_score_pred_xstart": cs["pred_xstart"],
        },
    )


def run_p_sample_cond(case: dict[str, Any]) -> None:
    diff = build_diffusion(core(), case["spec"])
    torch.manual_seed(case["seed"])
    check_outputs(
        case,
        diff.p_sample(
            fake_model(learns_sigma(case["spec"])),
            tensor(case["x"]),
            tensor(case["t"]),
            cond_fn=cond_fn,
            model_kwargs={},
        ),
    )


def run_ddim_sample_cond(case: dict[str, Any]) -> None:
    diff = build_diffusion(core(), case["spec"])
    torch.manual_seed(case["seed"])
    check_outputs(
        case,
        diff.ddim_sample(
            fake_model(learns_sigma(case["spec"])),
            tensor(case["x"]),
            tensor(case["t"]),
            cond_fn=cond_fn,
            model_kwargs={},
            eta=case["eta"],
        ),
    )


def run_timestep_embedding(case: dict[str, Any]) -> None:
    timesteps = tensor(case["timesteps"])
    atol = float(np.spacing(np.float32(timesteps.max())))  # one ulp of the largest argument
    check_outputs(
        case,
        {"emb": core().timestep_embedding(timesteps, case["dim"])},
        {"emb": {"rtol": F32["rtol"], "atol": max(atol, F32["atol"])}},
    )


def run_loss_second_moment(case: dict[str, Any]) -> None:
    diff = build_diffusion(core(), case["spec"])
    sampler = core().LossSecondMomentResampler(diff)
    ts, losses, expected = (
        ARRAYS[case["ts"]],
        ARRAYS[case["losses"]],
        ARRAYS[case["outputs"]["weights"]],
    )
    # Preconditions: the case must reach the second-moment weights, not only the uniform warm-up
    # fallback, or it would pass against any sampler that returns ones.
    per_t = np.bincount(ts.ravel(), minlength=diff.num_timesteps)
    assert per_t.min() > sampler.history_per_term, f"[{case['name']}] some t never fills its FIFO"
    assert case["warm"][-1] and not case["warm"][0], f"[{case['name']}] never warms up"
    final = expected[-1]
    assert final.max() > 3 * final.min(), f"[{case['name']}] warm weights are nearly uniform"
    for i in range(len(ts)):
        # The reference's calling convention: Python lists of ints and floats.
        sampler.update_with_all_losses(ts[i].tolist(), losses[i].tolist())
        assert sampler._warmed_up() == case["warm"][i], f"[{case['name']}] warm after batch {i}"
        assert_close(
            case["name"],
            f"weights after batch {i} (warm={case['warm'][i]})",
            np.asarray(sampler.weights(), dtype=np.float64),
            expected[i],
            {"rtol": 1e-12, "atol": 0.0},
        )


def run_unet(case: dict[str, Any]) -> None:
    model = getattr(core(), case["cls"])(**case["kwargs"]).eval()
    shapes = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
    ref_shapes = [(k, tuple(s)) for k, s in case["state_dict_shapes"]]
    missing = sorted(set(ref_shapes) - set(shapes))
    unexpected = sorted(set(shapes) - set(ref_shapes))
    assert not missing and not unexpected, (
        f"[{case['name']}] state-dict keys/shapes differ from the reference: missing {missing[:8]}, unexpected {unexpected[:8]}"
    )
    weights = deterministic_weights(ref_shapes)
    assert math.isclose(
        sum(v.double().sum().item() for v in weights.values()), case["weights_sum"], rel_tol=1e-12
    )
    model.load_state_dict(weights, strict=True)
    call_kwargs: dict[str, torch.Tensor] = {}
    if "y" in case["call"]:
        call_kwargs["y"] = tensor("unet/y")
    if "low_res" in case["call"]:
        call_kwargs["low_res"] = tensor("unet/low_res")
    with torch.no_grad():
        out = model(tensor("unet/x"), tensor("unet/timesteps"), **call_kwargs)
    check_outputs(case, {"out": out.float().contiguous()}, {"out": UNET})


RUNNERS: dict[str, Callable[[dict[str, Any]], None]] = {
    "schedule": run_schedule,
    "q": run_q,
    "p_mean_variance": run_p_mean_variance,
    "training_losses": run_training_losses,
    "normal_kl": run_normal_kl,
    "normal_kl_prior": run_normal_kl_prior,
    "decoder_nll": run_decoder_nll,
    "space_timesteps": run_space_timesteps,
    "space_timesteps_error": run_space_timesteps_error,
    "spaced_diffusion": run_spaced_diffusion,
    "p_sample": run_p_sample,
    "ddim_sample": run_ddim_sample,
    "ddim_reverse_sample": run_ddim_reverse_sample,
    "p_sample_loop": run_p_sample_loop,
    "ddim_sample_loop": run_ddim_sample_loop,
    "ddim_sample_loop_noise": run_ddim_sample_loop,
    "calc_bpd_loop": run_calc_bpd_loop,
    "condition": run_condition,
    "p_sample_cond": run_p_sample_cond,
    "ddim_sample_cond": run_ddim_sample_cond,
    "timestep_embedding": run_timestep_embedding,
    "loss_second_moment": run_loss_second_moment,
    "unet": run_unet,
}


def test_shared_standins_match_fixture() -> None:
    """The fake model, cond_fn and weight generator here are the ones the fixture was made with."""
    x, t = tensor("in/x_start"), tensor("in/t_1000")
    fingerprints = {
        "fake_model_sigma": fake_model(True)(x, t),
        "fake_model_plain": fake_model(False)(x, t.float() * 0.37),
        "cond_fn": cond_fn(x, t),
    }
    for name, actual in fingerprints.items():
        assert_close("stand-ins", name, actual, ARRAYS[f"fingerprint/{name}"], STANDIN)
    sd = deterministic_weights([("a.weight", (4, 3, 3, 3)), ("a.bias", (4,)), ("n.weight", (4,))])
    assert torch.equal(torch.cat([v.flatten() for v in sd.values()]), tensor("fingerprint/weights"))


def test_every_case_kind_is_handled() -> None:
    """A new kind in the fixture needs a runner here."""
    assert {c["kind"] for c in CASES} <= set(RUNNERS)


@pytest.mark.parametrize("case", CASES, ids=[f"{c['kind']}:{c['name']}" for c in CASES])
def test_reference_parity(case: dict[str, Any]) -> None:
    """Recompute one reference quantity with raydiff.core and compare."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # match the fixture's single-threaded reductions
    try:
        RUNNERS[case["kind"]](case)
    finally:
        torch.set_num_threads(threads)
