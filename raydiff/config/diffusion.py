"""The diffusion section: the process and objective (improved-diffusion's diffusion flags)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from raydiff.config.field_values import invalid

NoiseSchedule = Literal["linear", "cosine"]


@dataclass(kw_only=True, frozen=True)
class DiffusionConfig:
    """The diffusion process and objective (improved-diffusion's diffusion flags and defaults)."""

    diffusion_steps: int = 1000
    """T, the number of diffusion steps the model is trained with."""
    noise_schedule: NoiseSchedule = "linear"
    """Beta schedule: 'linear' (DDPM) or 'cosine' (IDDPM eq. 17)."""
    timestep_respacing: str = ""
    """Steps to sample with: '' (all), a count '250', sections '10,15,20' or 'ddimN'."""
    learn_sigma: bool = False
    """Learn the variance (LEARNED_RANGE, IDDPM eq. 15); the model outputs 2x channels."""
    sigma_small: bool = False
    """With a fixed variance, use beta~_t (FIXED_SMALL) instead of beta_t (FIXED_LARGE)."""
    use_kl: bool = False
    """Train on the variational bound L_vlb (RESCALED_KL) instead of the MSE."""
    predict_xstart: bool = False
    """Predict x_0 instead of epsilon."""
    rescale_timesteps: bool = True
    """Feed the model t scaled to [0, 1000) whatever T is (improved-diffusion's default)."""
    rescale_learned_sigmas: bool = True
    """With learn_sigma, weight the VB term by T/1000: L_hybrid (RESCALED_MSE)."""

    def __post_init__(self) -> None:
        s = "diffusion"
        # A chain of one step has no posterior variance to extend (improved-diffusion's
        # GaussianDiffusion indexes posterior_variance[1]): 2 steps at least, respaced too.
        if self.diffusion_steps < 2:
            raise invalid(s, "diffusion_steps", self.diffusion_steps, "must be >= 2")
        valid = get_args(NoiseSchedule)
        if self.noise_schedule not in valid:
            raise invalid(s, "noise_schedule", self.noise_schedule, f"valid: {', '.join(valid)}")
        if self.noise_schedule == "linear" and self.diffusion_steps <= 20:
            # The linear schedule ends at beta_T = 20 / T, which reaches 1 (abar_T = 0) at T = 20.
            raise invalid(
                s,
                "diffusion_steps",
                self.diffusion_steps,
                "the linear schedule needs > 20 steps; use 'cosine' for fewer",
            )
        if self.timestep_respacing:
            from raydiff.core.respace import space_timesteps  # pure torch/NumPy, no cycle at import

            try:
                kept = space_timesteps(self.diffusion_steps, self.timestep_respacing)
            except ValueError as err:
                raise invalid(s, "timestep_respacing", self.timestep_respacing, str(err)) from None
            if len(kept) < 2:
                raise invalid(
                    s, "timestep_respacing", self.timestep_respacing, "must keep >= 2 steps"
                )
