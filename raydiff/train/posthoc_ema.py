"""The math of EDM2's post-hoc EMA (Karras et al. 2024, "Analyzing and Improving the Training
Dynamics of Diffusion Models", section 3 and appendix C): power-function averaging profiles,
their tracking during training, and the reconstruction of any profile after training from a few
stored snapshots.

A profile with exponent ``gamma`` averages the weights theta(tau) over the training so far,
[0, t], with density p_t(tau) = (gamma + 1) tau^gamma / t^(gamma + 1) (eq. 121). Its width
relative to the training time is ``sigma_rel`` (eq. 123). Tracking it step by step
(:class:`PowerFunctionEMA`, eq. 127) averages the weights of step tau with exactly the mass
p_t gives the interval (tau - 1, tau]; so every snapshot is an inner product <p, theta>, and a
profile that is a combination of snapshot profiles is that combination of the snapshots
(:func:`reconstruction_coefficients`, algorithm 3; :class:`WeightedSum`).

Pure torch + NumPy: no Ray, no config. Times are in training steps (EDM2 counts images; only
ratios of times enter the math).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)

_GOLDEN = (1 + math.sqrt(5)) / 2
SIGMA_REL_MAX = _GOLDEN**-2.5
"""The widest profile there is: eq. 123 peaks at gamma = golden ratio - 2 (about -0.382) with
sigma_rel = golden ratio^-2.5 (about 0.3003). EDM2's command line caps at 0.289 (gamma >= 0,
the uniform average); up to this value a profile still exists, its weights falling with time."""

RECONSTRUCTION_ERROR_LIMIT = 1e-2
"""A suggested refusal threshold for :func:`reconstruction_error` (docs/posthoc_ema.md gives the
experiment behind it)."""


def sigma_rel_to_gamma(sigma_rel: float) -> float:
    """The exponent of the profile with relative standard deviation ``sigma_rel`` (eq. 126,
    algorithm 2): the largest real root of
    gamma^3 + 7 gamma^2 + (16 - sigma_rel^-2) gamma + (12 - sigma_rel^-2), the one on eq. 123's
    falling side (gamma >= -0.382), where the profile is square-integrable as eq. 151 needs.
    """
    if not (math.isfinite(sigma_rel) and 0 < sigma_rel <= SIGMA_REL_MAX):
        raise ValueError(
            f"sigma_rel {sigma_rel} has no power-function profile: valid values are in "
            f"(0, {SIGMA_REL_MAX:.4f}] (EDM2 uses (0, 0.289), gamma >= 0)"
        )
    inverse_square = sigma_rel**-2
    roots = np.roots([1.0, 7.0, 16.0 - inverse_square, 12.0 - inverse_square])
    # In range all three roots are real; at the peak the double root may come back with a
    # rounding-sized imaginary part, whose real part is still the root.
    return float(roots.real.max())


def power_beta(*, gamma: float, step: int, dt: int = 1) -> float:
    """The decay that keeps a running average on the profile ``gamma`` (eq. 127):
    beta = (1 - dt / t)^(gamma + 1), t = ``step`` the training time after the update.

    At the first step (t = dt) beta is 0 for every gamma: the average becomes the weights.
    """
    if not (math.isfinite(gamma) and gamma > -1):
        raise ValueError(f"gamma {gamma} is invalid: a power-function profile needs gamma > -1")
    if step <= 0:
        raise ValueError(f"step {step} is invalid: the time after an update is a step >= 1")
    if not 0 < dt <= step:
        raise ValueError(f"dt {dt} is invalid: the update's length is in [1, step={step}]")
    return (1 - dt / step) ** (gamma + 1)


def rate_to_sigma_rel(rate: float, *, step: int) -> float:
    """The sigma_rel, at training step ``step``, of improved-diffusion's fixed-rate EMA: its
    exponential profile's standard deviation 1 / (-ln rate) steps, relative to ``step``. It holds
    once step >> 1 / (1 - rate), the initial weights' share then negligible (docs/posthoc_ema.md);
    unlike a power-function profile's, it shrinks as training goes on.
    """
    if not (math.isfinite(rate) and 0 < rate < 1):
        raise ValueError(f"EMA rate {rate} is invalid: a decay per step is in (0, 1)")
    if step <= 0:
        raise ValueError(f"step {step} is invalid: a training step is >= 1")
    return 1.0 / (-math.log(rate) * step)


def inner_products(
    t_a: np.ndarray, gamma_a: np.ndarray, t_b: np.ndarray, gamma_b: np.ndarray
) -> np.ndarray:
    """<p_a, p_b> (eq. 151, algorithm 3) over broadcast arrays: the integral of p_a * p_b over
    time, where the shorter profile's end cuts the integral (times > 0, gamma_a + gamma_b + 1 > 0
    checked by callers)."""
    exponent = np.where(t_a < t_b, gamma_b, -gamma_a)
    numerator = (gamma_a + 1) * (gamma_b + 1) * (t_a / t_b) ** exponent
    return numerator / ((gamma_a + gamma_b + 1) * np.maximum(t_a, t_b))


def _profile_arrays(
    profiles: Sequence[tuple[float, float]], *, role: str
) -> tuple[np.ndarray, np.ndarray]:
    """(times, gammas) of ``(t, sigma_rel)`` pairs, each checked."""
    times, gammas = [], []
    for t, sigma_rel in profiles:
        if not (math.isfinite(t) and t > 0):
            raise ValueError(
                f"{role} time {t} is invalid: a profile averages the training up to a time > 0 "
                "(a snapshot taken before the first step holds no profile)"
            )
        times.append(float(t))
        gammas.append(sigma_rel_to_gamma(sigma_rel))
    return np.array(times, dtype=np.float64), np.array(gammas, dtype=np.float64)


def _gram(
    a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
) -> np.ndarray:  # [len(a), len(b)]
    return inner_products(a[0][:, None], a[1][:, None], b[0][None, :], b[1][None, :])


def reconstruction_coefficients(
    snapshots: Sequence[tuple[float, float]], targets: Sequence[tuple[float, float]]
) -> np.ndarray:
    """Weights X [len(snapshots), len(targets)], float64, such that target k is approximately
    sum_i X[i, k] * snapshot_i (algorithm 3). Each entry is a ``(t, sigma_rel)`` pair.

    The least-squares fit of each target profile by the snapshot profiles: X = A^-1 B with
    A[i, j] = <p_i, p_j> and B[i, k] = <p_i, p_k> (eq. 151); each column is then scaled to sum
    to 1, so that constant weights stay constant. A target may not end after the last snapshot
    (no snapshot saw that training).
    """
    if len(snapshots) == 0:
        raise ValueError("no snapshots: a reconstruction combines at least one stored snapshot")
    for i, (t, sigma_rel) in enumerate(snapshots):
        if (t, sigma_rel) in snapshots[:i]:
            raise ValueError(
                f"snapshot (t={t}, sigma_rel={sigma_rel}) is given twice: each (time, sigma_rel) "
                "may appear once (the same profile twice makes the system singular)"
            )
    stored = _profile_arrays(snapshots, role="snapshot")
    wanted = _profile_arrays(targets, role="target")
    last = float(stored[0].max())
    late = [float(t) for t in wanted[0] if t > last]
    if late:
        raise ValueError(
            f"target time {late[0]} is after the last snapshot's ({last}): a reconstruction "
            f"only sees the training its snapshots saw; choose a time <= {last}"
        )
    try:
        solution = np.linalg.solve(_gram(stored, stored), _gram(stored, wanted))
    except np.linalg.LinAlgError as error:
        raise ValueError(
            f"the snapshot profiles are linearly dependent ({error}): give snapshots of "
            "distinct times or sigma_rels"
        ) from error
    return solution / solution.sum(axis=0, keepdims=True)


def reconstruction_error(
    snapshots: Sequence[tuple[float, float]], target: tuple[float, float]
) -> float:
    """||p - p_hat|| / ||p||: the relative L2 distance between the target profile p and its
    reconstruction p_hat = sum_i x_i p_i (:func:`reconstruction_coefficients`), expanded with the
    Gram matrix: ||p - p_hat||^2 = <p, p> - 2 x.b + x.A.x. It bounds the reconstructed weights'
    error per coordinate by ||p - p_hat|| * ||theta - c|| (docs/posthoc_ema.md).
    """
    coefficients = reconstruction_coefficients(snapshots, [target])[:, 0]
    stored = _profile_arrays(snapshots, role="snapshot")
    wanted = _profile_arrays([target], role="target")
    gram = _gram(stored, stored)
    cross = _gram(stored, wanted)[:, 0]
    norm_sq = float(_gram(wanted, wanted)[0, 0])
    distance_sq = norm_sq - 2 * coefficients @ cross + coefficients @ gram @ coefficients
    return math.sqrt(max(float(distance_sq), 0.0) / norm_sq)


class WeightedSum:
    """sum_i c_i * state_i of state dicts added one at a time, in float32: one reconstructed
    target, built while only one snapshot is in memory. Tensors that are not floating point
    (integer buffers) cannot be averaged; they come from the last state dict, as EDM2 copies
    buffers as they are."""

    def __init__(self) -> None:
        self.total: dict[str, torch.Tensor] = {}
        self.count = 0

    def add(self, state: Mapping[str, torch.Tensor], coefficient: float) -> None:
        """Add ``coefficient * state`` (its keys and shapes checked against the first's)."""
        if self.count and set(state) != set(self.total):
            differ = sorted(set(state) ^ set(self.total))
            raise ValueError(
                f"state dict {self.count} has other keys than state dict 0 (e.g. {differ[:3]}): "
                "snapshots of one model have the same keys"
            )
        for key, value in state.items():
            value = value.detach()
            if not self.count:
                self.total[key] = torch.zeros(value.shape, dtype=torch.float32, device=value.device)
            elif value.shape != self.total[key].shape:
                raise ValueError(
                    f"{key!r} has shape {tuple(value.shape)} in state dict {self.count} but "
                    f"{tuple(self.total[key].shape)} in state dict 0: snapshots of one model agree"
                )
            if value.is_floating_point():
                self.total[key].add_(value.to(torch.float32), alpha=float(coefficient))
            else:
                self.total[key] = value.clone()
        self.count += 1

    def result(self) -> dict[str, torch.Tensor]:
        """The sum so far (at least one state dict added)."""
        if not self.count:
            raise ValueError("no state dicts: a combination takes at least one snapshot")
        return dict(self.total)


def profile_key(sigma_rel: float) -> str:
    """The name of a profile in snapshots and state dicts: sigma_rel with three decimals (as
    EDM2 names its snapshot files)."""
    return f"{sigma_rel:.3f}"


class PowerFunctionEMA:
    """Running power-function averages (eq. 127) of a module's parameters, one per sigma_rel,
    in float32; the module's buffers are kept as they are (the latest ones seen).

    A sigma_rel must be written exactly with three decimals (0.05, 0.125): its snapshots are
    named so (:func:`profile_key`), and a reconstruction reads the profile back from the name.
    """

    def __init__(self, module: torch.nn.Module, *, sigma_rels: Sequence[float]) -> None:
        if len(sigma_rels) == 0:
            raise ValueError("sigma_rels is empty: track at least one profile, e.g. 0.05, 0.10")
        self.gammas = tuple(sigma_rel_to_gamma(sigma_rel) for sigma_rel in sigma_rels)
        for sigma_rel in sigma_rels:
            if float(profile_key(sigma_rel)) != sigma_rel:
                raise ValueError(
                    f"sigma_rel {sigma_rel} has more than three decimals: snapshots are named "
                    f"by sigma_rel with three ({profile_key(sigma_rel)})"
                )
        keys = [profile_key(sigma_rel) for sigma_rel in sigma_rels]
        if len(set(keys)) != len(keys):
            raise ValueError(f"sigma_rels {list(sigma_rels)} repeat a value: give each once")
        self.sigma_rels = tuple(float(sigma_rel) for sigma_rel in sigma_rels)
        self._start(module)

    def _start(self, module: torch.nn.Module) -> None:
        """Every profile starts as ``module``'s weights, before the first step."""
        self.step = 0
        self.parameter_names = [name for name, _ in module.named_parameters()]
        saved = module.state_dict().keys()
        self.buffers = {
            name: buffer.detach().clone()
            for name, buffer in module.named_buffers()
            if name in saved  # persistent ones: what a state dict holds
        }
        # A snapshot lists its entries in the module's state-dict order.
        kept = set(self.parameter_names) | set(self.buffers)
        self._order = [name for name in saved if name in kept]
        current = [p.detach() for p in module.parameters()]
        self.profiles = {
            profile_key(sigma_rel): [p.to(torch.float32, copy=True) for p in current]
            for sigma_rel in self.sigma_rels
        }

    @torch.no_grad()
    def update(self, module: torch.nn.Module, *, step: int, stepped: bool = True) -> None:
        """Fold the weights after training step ``step`` (the step just taken; the first is 1)
        into every profile: avg <- avg + (1 - beta) (theta - avg) (eq. 127, dt = 1 step). A
        skipped step (``stepped`` false) too: t counts steps."""
        if step <= self.step:
            raise ValueError(
                f"step {step} is invalid: each update follows a new step, after step {self.step}"
            )
        current = [p.detach().to(torch.float32) for p in module.parameters()]
        if len(current) != len(self.parameter_names):
            raise ValueError(
                f"the module has {len(current)} parameters, the tracked one "
                f"{len(self.parameter_names)}: update with the module the tracker was built for"
            )
        for gamma, average in zip(self.gammas, self.profiles.values(), strict=True):
            torch._foreach_lerp_(average, current, 1.0 - power_beta(gamma=gamma, step=step))
        for name, buffer in module.named_buffers():
            if name in self.buffers:
                self.buffers[name].copy_(buffer)
        self.step = step

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue bit for bit (copies; loads with
        ``torch.load(weights_only=True)``)."""
        return {
            "sigma_rels": list(self.sigma_rels),
            "step": self.step,
            "parameter_names": list(self.parameter_names),
            "profiles": {
                key: {name: p.clone() for name, p in zip(self.parameter_names, params, strict=True)}
                for key, params in self.profiles.items()
            },
            "buffers": {name: buffer.clone() for name, buffer in self.buffers.items()},
        }

    @torch.no_grad()
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore every profile, the buffers and the step from :meth:`state_dict`'s dict."""
        if list(state["sigma_rels"]) != list(self.sigma_rels):
            raise ValueError(
                f"the state tracks sigma_rels {list(state['sigma_rels'])}, this tracker "
                f"{list(self.sigma_rels)}: resume with the same sigma_rels"
            )
        if list(state["parameter_names"]) != self.parameter_names:
            raise ValueError(
                "the state's parameters are not this module's: resume with the same model"
            )
        for key, params in self.profiles.items():
            saved = state["profiles"][key]
            for name, param in zip(self.parameter_names, params, strict=True):
                param.copy_(_same_shape(name, saved[name], param))
        for name, buffer in self.buffers.items():
            buffer.copy_(_same_shape(name, state["buffers"][name], buffer))
        self.step = int(state["step"])

    def saved(self, module: torch.nn.Module) -> dict[str, dict[Any, Any]]:
        """Its state in ``trainer.pt`` (its snapshots are written apart, under ``posthoc_ema/``)."""
        return {"trainer": {"posthoc_ema": self.state_dict()}}

    def restore(self, checkpoint: dict[str, Any], module: torch.nn.Module) -> None:
        """The profiles as the checkpoint left them; a checkpoint without them (tracking turned
        on since) starts them from ``module``'s restored weights at its step."""
        saved = checkpoint["trainer"].get("posthoc_ema")
        if saved is not None:
            self.load_state_dict(saved)
            return
        logger.warning(
            "the checkpoint has no post-hoc EMA profiles: tracking starts from its weights at "
            "step %d (snapshots before it cannot be reconstructed)",
            int(checkpoint["trainer"]["step"]),
        )
        self._start(module)

    def evaluation_weights(self, module: torch.nn.Module) -> None:
        return None  # a run evaluates with its fixed-rate EMA; profiles are reconstructed from

    def snapshot(self, *, dtype: torch.dtype = torch.float16) -> dict[str, dict[str, torch.Tensor]]:
        """{profile_key(sigma_rel): the module's state dict with that average}, on the CPU, the
        averages (and floating-point buffers) in ``dtype``: what EDM2 stores every so often."""
        snapshots = {}
        for key, params in self.profiles.items():
            values = dict(zip(self.parameter_names, params, strict=True)) | self.buffers
            snapshots[key] = {
                name: values[name].to(
                    device="cpu",
                    dtype=dtype if values[name].is_floating_point() else None,
                    copy=True,
                )
                for name in self._order
            }
        return snapshots


def _same_shape(name: str, saved: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    if saved.shape != current.shape:
        raise ValueError(
            f"{name!r} has shape {tuple(saved.shape)} in the state but {tuple(current.shape)} "
            "here: resume with the same model"
        )
    return saved
