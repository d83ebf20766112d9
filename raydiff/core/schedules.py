"""Noise (beta) schedules, in float64 NumPy as improved-diffusion computes them.

The schedules are computed once per diffusion object and only cast to float32 when gathered at
``t`` (see ``GaussianDiffusion``), so they must be bit-exact with the reference in float64.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

BETA_SCHEDULES = ("linear", "cosine")


def get_named_beta_schedule(schedule_name: str, num_diffusion_timesteps: int) -> np.ndarray:
    """Return the float64 betas of a named schedule for ``num_diffusion_timesteps`` steps.

    ``linear`` is Ho et al.'s schedule rescaled so that it stays similar for any T;
    ``cosine`` is IDDPM eq. 17 (s = 0.008, betas clipped at 0.999).
    """
    if not isinstance(num_diffusion_timesteps, int) or num_diffusion_timesteps < 1:
        raise ValueError(
            f"num_diffusion_timesteps must be a positive integer, got {num_diffusion_timesteps!r}"
        )
    if schedule_name == "linear":
        # Scaling keeps beta_1 ... beta_T comparable to the 1000-step schedule of DDPM.
        scale = 1000 / num_diffusion_timesteps
        beta_start = scale * 0.0001
        beta_end = scale * 0.02
        return np.linspace(beta_start, beta_end, num_diffusion_timesteps, dtype=np.float64)
    if schedule_name == "cosine":
        # IDDPM eq. 17: abar(t) = f(t) / f(0), f(t) = cos((t/T + s) / (1 + s) * pi/2)^2. The
        # normalisation by f(0) cancels in the ratio abar(t2)/abar(t1), so f is used directly.
        return betas_for_alpha_bar(
            num_diffusion_timesteps,
            lambda t: math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2,
        )
    raise ValueError(
        f"unknown beta schedule {schedule_name!r}; valid schedules: {', '.join(BETA_SCHEDULES)}"
    )


def betas_for_alpha_bar(
    num_diffusion_timesteps: int,
    alpha_bar: Callable[[float], float],
    max_beta: float = 0.999,
) -> np.ndarray:
    """Discretise a continuous ``alpha_bar(t)``, t in [0, 1], into float64 betas.

    ``beta_i = min(1 - alpha_bar((i + 1) / T) / alpha_bar(i / T), max_beta)``; the clip avoids the
    singularity at t = T where alpha_bar reaches 0 (IDDPM section 3.2).
    """
    betas = []
    for i in range(num_diffusion_timesteps):
        t1 = i / num_diffusion_timesteps
        t2 = (i + 1) / num_diffusion_timesteps
        betas.append(min(1 - alpha_bar(t2) / alpha_bar(t1), max_beta))
    return np.array(betas)
