"""The diffusion core: pure PyTorch, no Ray, improved-diffusion's public names and signatures.

Porting improved-/guided-diffusion code is a change of import::

    from raydiff.core import GaussianDiffusion, SpacedDiffusion, space_timesteps, UNetModel

Building these from a typed config is ``raydiff.factory`` (above the core: importing
``raydiff.core`` loads no config, data or Ray module).
"""

from raydiff.core.gaussian_diffusion import (
    GaussianDiffusion,
    LossType,
    ModelMeanType,
    ModelVarType,
)
from raydiff.core.losses import (
    approx_standard_normal_cdf,
    discretized_gaussian_log_likelihood,
    mean_flat,
    normal_kl,
)
from raydiff.core.nn_layers import timestep_embedding
from raydiff.core.respace import SpacedDiffusion, space_timesteps
from raydiff.core.schedules import betas_for_alpha_bar, get_named_beta_schedule
from raydiff.core.timestep_sampler import (
    LossAwareSampler,
    LossSecondMomentResampler,
    LossSync,
    ScheduleSampler,
    TorchDistributedLossSync,
    UniformSampler,
    create_named_schedule_sampler,
)
from raydiff.core.unet import EncoderUNetModel, SuperResModel, UNetModel

__all__ = [
    "EncoderUNetModel",
    "GaussianDiffusion",
    "LossAwareSampler",
    "LossSecondMomentResampler",
    "LossSync",
    "LossType",
    "ModelMeanType",
    "ModelVarType",
    "ScheduleSampler",
    "SpacedDiffusion",
    "SuperResModel",
    "TorchDistributedLossSync",
    "UNetModel",
    "UniformSampler",
    "approx_standard_normal_cdf",
    "betas_for_alpha_bar",
    "create_named_schedule_sampler",
    "discretized_gaussian_log_likelihood",
    "get_named_beta_schedule",
    "mean_flat",
    "normal_kl",
    "space_timesteps",
    "timestep_embedding",
]
