"""Gaussian diffusion: forward process, model posterior, training losses, samplers, bits/dim.

Same public names, signatures and numbers as improved-diffusion / guided-diffusion
(``GaussianDiffusion``, ``ModelMeanType``, ``ModelVarType``, ``LossType``), so porting code is a
change of import. Coefficient arrays are computed in float64 NumPy and cast to float32 when
gathered at ``t``; all tensor math runs in float32 (or the inputs' dtype).

Differences from the reference that do not change any number:
- the float32 coefficient tables are built once per device instead of at every gather;
- samplers accept an optional ``generator`` for reproducible noise without touching the global RNG
  (when it is ``None`` they draw exactly as the reference does, from the global torch RNG), or
  a :class:`~raydiff.core.keyed_noise.RowNoise` that draws each batch row from its own keyed
  stream, so that a sample does not depend on the batch it is drawn in;
- user errors raise ``ValueError`` naming the bad value.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from raydiff.core.keyed_noise import RowNoise
from raydiff.core.losses import discretized_gaussian_log_likelihood, mean_flat, normal_kl

Model = Callable[..., torch.Tensor]
"""Anything called as ``model(x_t, t, **model_kwargs) -> output``."""
CondFn = Callable[..., torch.Tensor]
"""``cond_fn(x_t, t, **model_kwargs)`` returns grad_x log p(y | x_t) (classifier guidance)."""
DenoisedFn = Callable[[torch.Tensor], torch.Tensor]
NoiseGenerator = torch.Generator | RowNoise
"""Where a sampler's noise comes from: one generator for the whole batch, or a stream per batch
row (row b's noise then depends only on its key, so a sample does not change with the batch it
is computed in: what distributed sampling needs)."""


class ModelMeanType(enum.Enum):
    """Which quantity the model predicts."""

    PREVIOUS_X = enum.auto()  # x_{t-1}
    START_X = enum.auto()  # x_0
    EPSILON = enum.auto()  # the noise epsilon


class ModelVarType(enum.Enum):
    """How the variance of p(x_{t-1} | x_t) is obtained.

    LEARNED_RANGE (IDDPM eq. 15) interpolates in log space between FIXED_SMALL (beta~_t) and
    FIXED_LARGE (beta_t).
    """

    LEARNED = enum.auto()
    FIXED_SMALL = enum.auto()
    FIXED_LARGE = enum.auto()
    LEARNED_RANGE = enum.auto()


class LossType(enum.Enum):
    """Training objective."""

    MSE = enum.auto()  # simple MSE (plus the raw VB term when the variance is learned)
    RESCALED_MSE = enum.auto()  # MSE + VB * T/1000 when learning sigma: IDDPM's L_hybrid
    KL = enum.auto()  # the variational bound term L_t
    RESCALED_KL = enum.auto()  # L_t * T: an unbiased estimate of the full bound

    def is_vb(self) -> bool:
        """True for the two pure variational-bound objectives."""
        return self in (LossType.KL, LossType.RESCALED_KL)


class GaussianDiffusion:
    """Training and sampling utilities for a Gaussian diffusion with a given beta schedule.

    :param betas: 1-D array of betas, one per diffusion step (float64 recommended).
    :param model_mean_type: what the model outputs.
    :param model_var_type: how the variance is obtained.
    :param loss_type: the training objective.
    :param rescale_timesteps: pass float timesteps scaled to [0, 1000) to the model, as in the
        original paper, whatever T is (improved-diffusion's default is True, guided's False).
    """

    def __init__(
        self,
        *,
        betas: np.ndarray | Sequence[float],
        model_mean_type: ModelMeanType,
        model_var_type: ModelVarType,
        loss_type: LossType,
        rescale_timesteps: bool = False,
    ) -> None:
        for name, value, enum_type in (
            ("model_mean_type", model_mean_type, ModelMeanType),
            ("model_var_type", model_var_type, ModelVarType),
            ("loss_type", loss_type, LossType),
        ):
            if not isinstance(value, enum_type):
                valid = ", ".join(f"{enum_type.__name__}.{m.name}" for m in enum_type)
                raise ValueError(f"{name} must be one of {valid}; got {value!r}")
        self.model_mean_type = model_mean_type
        self.model_var_type = model_var_type
        self.loss_type = loss_type
        self.rescale_timesteps = rescale_timesteps

        # float64 throughout: the cumulative product over thousands of steps loses accuracy in
        # float32, and the reference computes every table in float64.
        betas = np.array(betas, dtype=np.float64)
        if betas.ndim != 1 or betas.size == 0:
            raise ValueError(f"betas must be a non-empty 1-D array, got shape {betas.shape}")
        if not ((betas > 0).all() and (betas <= 1).all()):
            bad = betas[(betas <= 0) | (betas > 1)]
            raise ValueError(f"every beta must lie in (0, 1]; got values like {bad[:3].tolist()}")
        self.betas = betas
        self.num_timesteps = int(betas.shape[0])

        alphas = 1.0 - betas
        self.alphas_cumprod = np.cumprod(alphas, axis=0)
        self.alphas_cumprod_prev = np.append(1.0, self.alphas_cumprod[:-1])
        self.alphas_cumprod_next = np.append(self.alphas_cumprod[1:], 0.0)

        # q(x_t | x_0) (DDPM eq. 4)
        self.sqrt_alphas_cumprod = np.sqrt(self.alphas_cumprod)
        self.sqrt_one_minus_alphas_cumprod = np.sqrt(1.0 - self.alphas_cumprod)
        self.log_one_minus_alphas_cumprod = np.log(1.0 - self.alphas_cumprod)
        self.sqrt_recip_alphas_cumprod = np.sqrt(1.0 / self.alphas_cumprod)
        self.sqrt_recipm1_alphas_cumprod = np.sqrt(1.0 / self.alphas_cumprod - 1)

        # q(x_{t-1} | x_t, x_0) (IDDPM eqs. 10-12)
        self.posterior_variance = (
            betas * (1.0 - self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        )
        # posterior_variance[0] is 0, so its log is replaced by the value at t = 1.
        self.posterior_log_variance_clipped = np.log(
            np.append(self.posterior_variance[1], self.posterior_variance[1:])
        )
        self.posterior_mean_coef1 = (
            betas * np.sqrt(self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        )
        self.posterior_mean_coef2 = (
            (1.0 - self.alphas_cumprod_prev) * np.sqrt(alphas) / (1.0 - self.alphas_cumprod)
        )

        # FIXED_LARGE uses beta_t, except at t = 0 where beta~_1 gives a better decoder NLL.
        fixed_large_variance = np.append(self.posterior_variance[1], self.betas[1:])
        self._tables64: dict[str, np.ndarray] = {
            "sqrt_alphas_cumprod": self.sqrt_alphas_cumprod,
            "sqrt_one_minus_alphas_cumprod": self.sqrt_one_minus_alphas_cumprod,
            "one_minus_alphas_cumprod": 1.0 - self.alphas_cumprod,
            "log_one_minus_alphas_cumprod": self.log_one_minus_alphas_cumprod,
            "sqrt_recip_alphas_cumprod": self.sqrt_recip_alphas_cumprod,
            "sqrt_recipm1_alphas_cumprod": self.sqrt_recipm1_alphas_cumprod,
            "posterior_variance": self.posterior_variance,
            "posterior_log_variance_clipped": self.posterior_log_variance_clipped,
            "posterior_mean_coef1": self.posterior_mean_coef1,
            "posterior_mean_coef2": self.posterior_mean_coef2,
            "recip_posterior_mean_coef1": 1.0 / self.posterior_mean_coef1,
            "posterior_mean_coef2_over_coef1": self.posterior_mean_coef2
            / self.posterior_mean_coef1,
            "log_betas": np.log(self.betas),
            "fixed_large_variance": fixed_large_variance,
            "fixed_large_log_variance": np.log(fixed_large_variance),
            "alphas_cumprod": self.alphas_cumprod,
            "alphas_cumprod_prev": self.alphas_cumprod_prev,
            "alphas_cumprod_next": self.alphas_cumprod_next,
        }
        self._tables32: dict[tuple[str, torch.device], torch.Tensor] = {}

    # ------------------------------------------------------------------ coefficient gathering

    def _extract(
        self, name: str, t: torch.Tensor, shape: torch.Size | Sequence[int]
    ) -> torch.Tensor:
        """Gather table ``name`` at timesteps ``t`` as float32, broadcast to ``shape``.

        Casting the whole float64 table to float32 once equals the reference's gather-then-cast.
        """
        key = (name, t.device)
        table = self._tables32.get(key)
        if table is None:
            table = torch.from_numpy(self._tables64[name]).to(device=t.device).float()
            self._tables32[key] = table
        res = table[t]  # [B]
        return res.view(-1, *([1] * (len(shape) - 1))).expand(shape)

    def _scale_timesteps(self, t: torch.Tensor) -> torch.Tensor:
        if self.rescale_timesteps:
            return t.float() * (1000.0 / self.num_timesteps)
        return t

    # ------------------------------------------------------------------ forward process

    def q_mean_variance(
        self, x_start: torch.Tensor, t: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Mean, variance and log-variance of q(x_t | x_0), each of ``x_start``'s shape."""
        mean = self._extract("sqrt_alphas_cumprod", t, x_start.shape) * x_start
        variance = self._extract("one_minus_alphas_cumprod", t, x_start.shape)
        log_variance = self._extract("log_one_minus_alphas_cumprod", t, x_start.shape)
        return mean, variance, log_variance

    def q_sample(
        self, x_start: torch.Tensor, t: torch.Tensor, noise: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Sample x_t ~ q(x_t | x_0) = N(sqrt(abar_t) x_0, (1 - abar_t) I) (DDPM eq. 4)."""
        if noise is None:
            noise = torch.randn_like(x_start)
        if noise.shape != x_start.shape:
            raise ValueError(
                f"noise shape {tuple(noise.shape)} must equal x_start shape {tuple(x_start.shape)}"
            )
        return (
            self._extract("sqrt_alphas_cumprod", t, x_start.shape) * x_start
            + self._extract("sqrt_one_minus_alphas_cumprod", t, x_start.shape) * noise
        )

    def q_posterior_mean_variance(
        self, x_start: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Mean, variance and clipped log-variance of q(x_{t-1} | x_t, x_0) (IDDPM eqs. 10-12)."""
        if x_start.shape != x_t.shape:
            raise ValueError(
                f"x_start shape {tuple(x_start.shape)} must equal x_t shape {tuple(x_t.shape)}"
            )
        posterior_mean = (
            self._extract("posterior_mean_coef1", t, x_t.shape) * x_start
            + self._extract("posterior_mean_coef2", t, x_t.shape) * x_t
        )
        posterior_variance = self._extract("posterior_variance", t, x_t.shape)
        posterior_log_variance_clipped = self._extract(
            "posterior_log_variance_clipped", t, x_t.shape
        )
        return posterior_mean, posterior_variance, posterior_log_variance_clipped

    # ------------------------------------------------------------------ reverse process

    def p_mean_variance(
        self,
        model: Model,
        x: torch.Tensor,
        t: torch.Tensor,
        clip_denoised: bool = True,
        denoised_fn: DenoisedFn | None = None,
        model_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Apply the model to get p(x_{t-1} | x_t) and the implied prediction of x_0.

        :return: ``mean``, ``variance``, ``log_variance`` and ``pred_xstart``, each of x's shape.
        """
        if model_kwargs is None:
            model_kwargs = {}
        batch = x.shape[0]
        if t.shape != (batch,):
            raise ValueError(f"t must have shape ({batch},) to match x, got {tuple(t.shape)}")
        model_output = model(x, self._scale_timesteps(t), **model_kwargs)
        return self._p_mean_variance_from_output(
            model_output, x, t, clip_denoised=clip_denoised, denoised_fn=denoised_fn
        )

    def _p_mean_variance_from_output(
        self,
        model_output: torch.Tensor,
        x: torch.Tensor,
        t: torch.Tensor,
        *,
        clip_denoised: bool,
        denoised_fn: DenoisedFn | None,
    ) -> dict[str, torch.Tensor]:
        channels = x.shape[1]
        if self.model_var_type in (ModelVarType.LEARNED, ModelVarType.LEARNED_RANGE):
            expected = (x.shape[0], channels * 2, *x.shape[2:])
            if model_output.shape != expected:
                raise ValueError(
                    f"with a learned variance ({self.model_var_type.name}) the model must output "
                    f"2 x {channels} channels {expected}, got {tuple(model_output.shape)}; "
                    "build it with learn_sigma=True"
                )
            model_output, model_var_values = torch.split(model_output, channels, dim=1)
            if self.model_var_type == ModelVarType.LEARNED:
                model_log_variance = model_var_values
                model_variance = torch.exp(model_log_variance)
            else:
                # IDDPM eq. 15: v in [-1, 1] interpolates log(beta~_t) .. log(beta_t); not clamped.
                min_log = self._extract("posterior_log_variance_clipped", t, x.shape)
                max_log = self._extract("log_betas", t, x.shape)
                frac = (model_var_values + 1) / 2
                model_log_variance = frac * max_log + (1 - frac) * min_log
                model_variance = torch.exp(model_log_variance)
        else:
            if model_output.shape != x.shape:
                raise ValueError(
                    f"with a fixed variance the model must output x's shape {tuple(x.shape)}, got "
                    f"{tuple(model_output.shape)}; build it with learn_sigma=False"
                )
            if self.model_var_type == ModelVarType.FIXED_LARGE:
                model_variance = self._extract("fixed_large_variance", t, x.shape)
                model_log_variance = self._extract("fixed_large_log_variance", t, x.shape)
            else:
                model_variance = self._extract("posterior_variance", t, x.shape)
                model_log_variance = self._extract("posterior_log_variance_clipped", t, x.shape)

        def process_xstart(x0: torch.Tensor) -> torch.Tensor:
            if denoised_fn is not None:
                x0 = denoised_fn(x0)
            if clip_denoised:
                return x0.clamp(-1, 1)
            return x0

        if self.model_mean_type == ModelMeanType.PREVIOUS_X:
            pred_xstart = process_xstart(
                self._predict_xstart_from_xprev(x_t=x, t=t, xprev=model_output)
            )
            model_mean = model_output
        else:
            if self.model_mean_type == ModelMeanType.START_X:
                pred_xstart = process_xstart(model_output)
            else:
                pred_xstart = process_xstart(
                    self._predict_xstart_from_eps(x_t=x, t=t, eps=model_output)
                )
            model_mean, _, _ = self.q_posterior_mean_variance(x_start=pred_xstart, x_t=x, t=t)
        return {
            "mean": model_mean,
            "variance": model_variance,
            "log_variance": model_log_variance,
            "pred_xstart": pred_xstart,
        }

    def _predict_xstart_from_eps(
        self, x_t: torch.Tensor, t: torch.Tensor, eps: torch.Tensor
    ) -> torch.Tensor:
        # x_0 = (x_t - sqrt(1 - abar) eps) / sqrt(abar), written with the reference's coefficients.
        return (
            self._extract("sqrt_recip_alphas_cumprod", t, x_t.shape) * x_t
            - self._extract("sqrt_recipm1_alphas_cumprod", t, x_t.shape) * eps
        )

    def _predict_xstart_from_xprev(
        self, x_t: torch.Tensor, t: torch.Tensor, xprev: torch.Tensor
    ) -> torch.Tensor:
        # Invert the posterior mean: x_0 = (x_prev - coef2 x_t) / coef1.
        return (
            self._extract("recip_posterior_mean_coef1", t, x_t.shape) * xprev
            - self._extract("posterior_mean_coef2_over_coef1", t, x_t.shape) * x_t
        )

    def _predict_eps_from_xstart(
        self, x_t: torch.Tensor, t: torch.Tensor, pred_xstart: torch.Tensor
    ) -> torch.Tensor:
        return (
            self._extract("sqrt_recip_alphas_cumprod", t, x_t.shape) * x_t - pred_xstart
        ) / self._extract("sqrt_recipm1_alphas_cumprod", t, x_t.shape)

    # ------------------------------------------------------------------ classifier guidance

    def condition_mean(
        self,
        cond_fn: CondFn,
        p_mean_var: dict[str, torch.Tensor],
        x: torch.Tensor,
        t: torch.Tensor,
        model_kwargs: dict[str, Any] | None = None,
    ) -> torch.Tensor:
        """Shift the mean by variance * grad log p(y | x_t) (Sohl-Dickstein et al. 2015; ADM alg. 1)."""
        gradient = cond_fn(x, self._scale_timesteps(t), **(model_kwargs or {}))
        return p_mean_var["mean"].float() + p_mean_var["variance"] * gradient.float()

    def condition_score(
        self,
        cond_fn: CondFn,
        p_mean_var: dict[str, torch.Tensor],
        x: torch.Tensor,
        t: torch.Tensor,
        model_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Condition the score: eps' = eps - sqrt(1 - abar_t) grad log p(y | x_t) (ADM alg. 2)."""
        alpha_bar = self._extract("alphas_cumprod", t, x.shape)
        eps = self._predict_eps_from_xstart(x, t, p_mean_var["pred_xstart"])
        eps = eps - (1 - alpha_bar).sqrt() * cond_fn(
            x, self._scale_timesteps(t), **(model_kwargs or {})
        )
        out = p_mean_var.copy()
        out["pred_xstart"] = self._predict_xstart_from_eps(x, t, eps)
        out["mean"], _, _ = self.q_posterior_mean_variance(x_start=out["pred_xstart"], x_t=x, t=t)
        return out

    # ------------------------------------------------------------------ ancestral sampling

    def p_sample(
        self,
        model: Model,
        x: torch.Tensor,
        t: torch.Tensor,
        clip_denoised: bool = True,
        denoised_fn: DenoisedFn | None = None,
        cond_fn: CondFn | None = None,
        model_kwargs: dict[str, Any] | None = None,
        *,
        generator: NoiseGenerator | None = None,
    ) -> dict[str, torch.Tensor]:
        """Sample x_{t-1} ~ p(x_{t-1} | x_t); no noise is added where t == 0.

        :return: ``sample`` and ``pred_xstart``.
        """
        out = self.p_mean_variance(
            model,
            x,
            t,
            clip_denoised=clip_denoised,
            denoised_fn=denoised_fn,
            model_kwargs=model_kwargs,
        )
        noise = _randn_like(x, generator)
        nonzero_mask = (t != 0).float().view(-1, *([1] * (x.ndim - 1)))
        if cond_fn is not None:
            out["mean"] = self.condition_mean(cond_fn, out, x, t, model_kwargs=model_kwargs)
        sample = out["mean"] + nonzero_mask * torch.exp(0.5 * out["log_variance"]) * noise
        return {"sample": sample, "pred_xstart": out["pred_xstart"]}

    def p_sample_loop(
        self,
        model: Model,
        shape: Sequence[int],
        noise: torch.Tensor | None = None,
        clip_denoised: bool = True,
        denoised_fn: DenoisedFn | None = None,
        cond_fn: CondFn | None = None,
        model_kwargs: dict[str, Any] | None = None,
        device: torch.device | str | None = None,
        progress: bool = False,
        *,
        generator: NoiseGenerator | None = None,
    ) -> torch.Tensor:
        """Generate samples with T ancestral steps; returns the final ``[N, C, H, W]`` batch."""
        return _last_sample(self.p_sample_loop_progressive(**_loop_kwargs(locals())))

    def p_sample_loop_progressive(
        self,
        model: Model,
        shape: Sequence[int],
        noise: torch.Tensor | None = None,
        clip_denoised: bool = True,
        denoised_fn: DenoisedFn | None = None,
        cond_fn: CondFn | None = None,
        model_kwargs: dict[str, Any] | None = None,
        device: torch.device | str | None = None,
        progress: bool = False,
        *,
        generator: NoiseGenerator | None = None,
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Like ``p_sample_loop`` but yields every step's ``p_sample`` output, from t = T-1 to 0."""
        yield from self._progressive(self.p_sample, **_loop_kwargs(locals()))

    # ------------------------------------------------------------------ DDIM

    def ddim_sample(
        self,
        model: Model,
        x: torch.Tensor,
        t: torch.Tensor,
        clip_denoised: bool = True,
        denoised_fn: DenoisedFn | None = None,
        cond_fn: CondFn | None = None,
        model_kwargs: dict[str, Any] | None = None,
        eta: float = 0.0,
        *,
        generator: NoiseGenerator | None = None,
    ) -> dict[str, torch.Tensor]:
        """One DDIM step x_t -> x_{t-1} (Song et al. 2020, eq. 12); ``eta=0`` is deterministic."""
        out = self.p_mean_variance(
            model,
            x,
            t,
            clip_denoised=clip_denoised,
            denoised_fn=denoised_fn,
            model_kwargs=model_kwargs,
        )
        if cond_fn is not None:
            out = self.condition_score(cond_fn, out, x, t, model_kwargs=model_kwargs)
        # Re-derive eps from the (clipped) x_0 prediction, whatever the model predicts.
        eps = self._predict_eps_from_xstart(x, t, out["pred_xstart"])
        alpha_bar = self._extract("alphas_cumprod", t, x.shape)
        alpha_bar_prev = self._extract("alphas_cumprod_prev", t, x.shape)
        sigma = (
            eta
            * torch.sqrt((1 - alpha_bar_prev) / (1 - alpha_bar))
            * torch.sqrt(1 - alpha_bar / alpha_bar_prev)
        )
        noise = _randn_like(x, generator)
        mean_pred = (
            out["pred_xstart"] * torch.sqrt(alpha_bar_prev)
            + torch.sqrt(1 - alpha_bar_prev - sigma**2) * eps
        )
        nonzero_mask = (t != 0).float().view(-1, *([1] * (x.ndim - 1)))
        sample = mean_pred + nonzero_mask * sigma * noise
        return {"sample": sample, "pred_xstart": out["pred_xstart"]}

    def ddim_reverse_sample(
        self,
        model: Model,
        x: torch.Tensor,
        t: torch.Tensor,
        clip_denoised: bool = True,
        denoised_fn: DenoisedFn | None = None,
        model_kwargs: dict[str, Any] | None = None,
        eta: float = 0.0,
    ) -> dict[str, torch.Tensor]:
        """One step of the deterministic DDIM ODE forwards in time: x_t -> x_{t+1}."""
        if eta != 0.0:
            raise ValueError(f"ddim_reverse_sample is deterministic: eta must be 0.0, got {eta}")
        out = self.p_mean_variance(
            model,
            x,
            t,
            clip_denoised=clip_denoised,
            denoised_fn=denoised_fn,
            model_kwargs=model_kwargs,
        )
        eps = self._predict_eps_from_xstart(x, t, out["pred_xstart"])
        alpha_bar_next = self._extract("alphas_cumprod_next", t, x.shape)
        mean_pred = (
            out["pred_xstart"] * torch.sqrt(alpha_bar_next) + torch.sqrt(1 - alpha_bar_next) * eps
        )
        return {"sample": mean_pred, "pred_xstart": out["pred_xstart"]}

    def ddim_sample_loop(
        self,
        model: Model,
        shape: Sequence[int],
        noise: torch.Tensor | None = None,
        clip_denoised: bool = True,
        denoised_fn: DenoisedFn | None = None,
        cond_fn: CondFn | None = None,
        model_kwargs: dict[str, Any] | None = None,
        device: torch.device | str | None = None,
        progress: bool = False,
        eta: float = 0.0,
        *,
        generator: NoiseGenerator | None = None,
    ) -> torch.Tensor:
        """Generate samples with DDIM over this diffusion's steps (respace it for fewer steps)."""
        return _last_sample(self.ddim_sample_loop_progressive(**_loop_kwargs(locals())))

    def ddim_sample_loop_progressive(
        self,
        model: Model,
        shape: Sequence[int],
        noise: torch.Tensor | None = None,
        clip_denoised: bool = True,
        denoised_fn: DenoisedFn | None = None,
        cond_fn: CondFn | None = None,
        model_kwargs: dict[str, Any] | None = None,
        device: torch.device | str | None = None,
        progress: bool = False,
        eta: float = 0.0,
        *,
        generator: NoiseGenerator | None = None,
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Like ``ddim_sample_loop`` but yields every step's output, from t = T-1 to 0."""
        yield from self._progressive(self.ddim_sample, **_loop_kwargs(locals()))

    def _progressive(
        self,
        step: Callable[..., dict[str, torch.Tensor]],
        model: Model,
        shape: Sequence[int],
        noise: torch.Tensor | None,
        device: torch.device | str | None,
        progress: bool,
        generator: NoiseGenerator | None,
        model_kwargs: dict[str, Any] | None,
        **step_kwargs: Any,
    ) -> Iterator[dict[str, torch.Tensor]]:
        """The loop both samplers share: ``step`` from t = T-1 down to 0, yielding each output."""
        img, device = self._initial_noise(model, shape, noise, device, generator)
        indices: Iterable[int] = range(self.num_timesteps - 1, -1, -1)
        if progress:
            from tqdm.auto import tqdm  # optional dependency, only for interactive use

            indices = tqdm(indices)
        for i in indices:
            t = torch.full((shape[0],), i, device=device, dtype=torch.long)
            with torch.no_grad():
                out = step(
                    model, img, t, model_kwargs=model_kwargs, generator=generator, **step_kwargs
                )
                yield out
                img = out["sample"]

    def _initial_noise(
        self,
        model: Model,
        shape: Sequence[int],
        noise: torch.Tensor | None,
        device: torch.device | str | None,
        generator: NoiseGenerator | None,
    ) -> tuple[torch.Tensor, torch.device]:
        if not isinstance(shape, (tuple, list)):
            raise ValueError(f"shape must be a tuple or list like (N, C, H, W), got {shape!r}")
        if device is None:
            if noise is not None:
                device = noise.device
            elif isinstance(model, torch.nn.Module):
                device = next(model.parameters()).device
            else:
                device = torch.device("cpu")
        device = torch.device(device)
        if noise is not None:
            return noise, device
        if generator is None:
            return torch.randn(*shape, device=device), device
        return _randn(tuple(shape), torch.float32, generator).to(device), device

    # ------------------------------------------------------------------ variational bound

    def _vb_terms_bpd(
        self,
        model: Model,
        x_start: torch.Tensor,
        x_t: torch.Tensor,
        t: torch.Tensor,
        clip_denoised: bool = True,
        model_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, torch.Tensor]:
        """One term L_t of the bound in bits/dim: decoder NLL at t == 0, else the KL (DDPM eq. 5)."""
        out = self.p_mean_variance(
            model, x_t, t, clip_denoised=clip_denoised, model_kwargs=model_kwargs
        )
        return self._vb_terms_from_p(out, x_start=x_start, x_t=x_t, t=t)

    def _vb_terms_from_p(
        self,
        out: dict[str, torch.Tensor],
        *,
        x_start: torch.Tensor,
        x_t: torch.Tensor,
        t: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        true_mean, _, true_log_variance_clipped = self.q_posterior_mean_variance(
            x_start=x_start, x_t=x_t, t=t
        )
        kl = normal_kl(true_mean, true_log_variance_clipped, out["mean"], out["log_variance"])
        kl = mean_flat(kl) / np.log(2.0)  # nats -> bits
        decoder_nll = -discretized_gaussian_log_likelihood(
            x_start, means=out["mean"], log_scales=0.5 * out["log_variance"]
        )
        decoder_nll = mean_flat(decoder_nll) / np.log(2.0)
        output = torch.where(t == 0, decoder_nll, kl)
        return {"output": output, "pred_xstart": out["pred_xstart"]}

    def training_losses(
        self,
        model: Model,
        x_start: torch.Tensor,
        t: torch.Tensor,
        model_kwargs: dict[str, Any] | None = None,
        noise: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Per-sample training losses at timesteps ``t``.

        :return: ``loss`` of shape [B]; for the MSE objectives also ``mse``, and ``vb`` when the
            variance is learned. Importance weights and reductions are the caller's business.
        """
        if model_kwargs is None:
            model_kwargs = {}
        if noise is None:
            noise = torch.randn_like(x_start)
        x_t = self.q_sample(x_start, t, noise=noise)

        terms: dict[str, torch.Tensor] = {}
        if self.loss_type.is_vb():
            terms["loss"] = self._vb_terms_bpd(
                model=model,
                x_start=x_start,
                x_t=x_t,
                t=t,
                clip_denoised=False,
                model_kwargs=model_kwargs,
            )["output"]
            if self.loss_type == LossType.RESCALED_KL:
                # L_t * T is an unbiased estimate of the whole bound under uniform t.
                terms["loss"] = terms["loss"] * self.num_timesteps
            return terms

        model_output = model(x_t, self._scale_timesteps(t), **model_kwargs)
        if self.model_var_type in (ModelVarType.LEARNED, ModelVarType.LEARNED_RANGE):
            channels = x_t.shape[1]
            expected = (x_t.shape[0], channels * 2, *x_t.shape[2:])
            if model_output.shape != expected:
                raise ValueError(
                    f"a learned variance needs a model output of shape {expected}, got "
                    f"{tuple(model_output.shape)}; build the model with learn_sigma=True"
                )
            model_output, model_var_values = torch.split(model_output, channels, dim=1)
            # IDDPM eq. 16 (L_hybrid): the VB term trains only the variance; the mean it sees is
            # detached so that L_simple alone drives the mean.
            frozen_out = torch.cat([model_output.detach(), model_var_values], dim=1)
            p_out = self._p_mean_variance_from_output(
                frozen_out, x_t, t, clip_denoised=False, denoised_fn=None
            )
            terms["vb"] = self._vb_terms_from_p(p_out, x_start=x_start, x_t=x_t, t=t)["output"]
            if self.loss_type == LossType.RESCALED_MSE:
                # The reference divides by 1000 "for equivalence with the initial implementation":
                # lambda = 0.001 at T = 1000 (IDDPM section 3.1).
                terms["vb"] = terms["vb"] * (self.num_timesteps / 1000.0)

        if self.model_mean_type == ModelMeanType.PREVIOUS_X:
            target = self.q_posterior_mean_variance(x_start=x_start, x_t=x_t, t=t)[0]
        elif self.model_mean_type == ModelMeanType.START_X:
            target = x_start
        else:
            target = noise
        if model_output.shape != target.shape:
            raise ValueError(
                f"model output shape {tuple(model_output.shape)} must match the target "
                f"{tuple(target.shape)}"
            )
        terms["mse"] = mean_flat((target - model_output) ** 2)
        terms["loss"] = terms["mse"] + terms["vb"] if "vb" in terms else terms["mse"]
        return terms

    def _prior_bpd(self, x_start: torch.Tensor) -> torch.Tensor:
        """KL(q(x_T | x_0) || N(0, I)) in bits/dim, per sample; the encoder-only prior term."""
        batch_size = x_start.shape[0]
        t = torch.full(
            (batch_size,), self.num_timesteps - 1, device=x_start.device, dtype=torch.long
        )
        qt_mean, _, qt_log_variance = self.q_mean_variance(x_start, t)
        kl_prior = normal_kl(mean1=qt_mean, logvar1=qt_log_variance, mean2=0.0, logvar2=0.0)
        return mean_flat(kl_prior) / np.log(2.0)

    def calc_bpd_loop(
        self,
        model: Model,
        x_start: torch.Tensor,
        clip_denoised: bool = True,
        model_kwargs: dict[str, Any] | None = None,
        *,
        generator: NoiseGenerator | None = None,
    ) -> dict[str, torch.Tensor]:
        """The full variational bound in bits/dim, walking t from T-1 down to 0.

        :return: ``total_bpd`` and ``prior_bpd`` of shape [N]; ``vb``, ``xstart_mse`` and ``mse``
            of shape [N, T] with columns in the walk's order (column 0 is t = T-1).
        """
        batch_size = x_start.shape[0]
        vb, xstart_mse, mse = [], [], []
        for step in range(self.num_timesteps - 1, -1, -1):
            t_batch = torch.full((batch_size,), step, device=x_start.device, dtype=torch.long)
            noise = _randn_like(x_start, generator)
            x_t = self.q_sample(x_start=x_start, t=t_batch, noise=noise)
            with torch.no_grad():
                out = self._vb_terms_bpd(
                    model,
                    x_start=x_start,
                    x_t=x_t,
                    t=t_batch,
                    clip_denoised=clip_denoised,
                    model_kwargs=model_kwargs,
                )
            vb.append(out["output"])
            xstart_mse.append(mean_flat((out["pred_xstart"] - x_start) ** 2))
            eps = self._predict_eps_from_xstart(x_t, t_batch, out["pred_xstart"])
            mse.append(mean_flat((eps - noise) ** 2))

        vb_t = torch.stack(vb, dim=1)
        prior_bpd = self._prior_bpd(x_start)
        return {
            "total_bpd": vb_t.sum(dim=1) + prior_bpd,
            "prior_bpd": prior_bpd,
            "vb": vb_t,
            "xstart_mse": torch.stack(xstart_mse, dim=1),
            "mse": torch.stack(mse, dim=1),
        }


def _loop_kwargs(names: dict[str, Any]) -> dict[str, Any]:
    """A sampling loop's own arguments (its ``locals()``), to hand on unchanged."""
    return {k: v for k, v in names.items() if k not in ("self", "__class__")}


def _last_sample(steps: Iterator[dict[str, torch.Tensor]]) -> torch.Tensor:
    (final,) = deque(steps, maxlen=1)
    return final["sample"]


def _randn_like(x: torch.Tensor, generator: NoiseGenerator | None) -> torch.Tensor:
    """``randn_like`` from the global RNG (the reference's behaviour) or from ``generator``."""
    if generator is None:
        return torch.randn_like(x)
    return _randn(tuple(x.shape), x.dtype, generator).to(x.device)


def _randn(shape: tuple[int, ...], dtype: torch.dtype, generator: NoiseGenerator) -> torch.Tensor:
    """Standard normal noise of ``shape`` from one generator, or each row from its own stream."""
    if isinstance(generator, torch.Generator):
        return torch.randn(shape, generator=generator, device=generator.device, dtype=dtype)
    return generator.draw(shape, dtype)
