"""The diffusion core: pure PyTorch, no Ray, improved-diffusion's public names and signatures.

Porting improved-/guided-diffusion code is a change of import::

    from raydiff.core import GaussianDiffusion, SpacedDiffusion, space_timesteps, UNetModel

Building these from a typed config is ``raydiff.factory`` (above the core: importing
``raydiff.core`` loads no config, data or Ray module). The names load on first use (PEP 562), so
importing one torch-free module of the package (``raydiff.core.unet_arguments``, which config
validation uses) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

# Where each public name lives.
_LOCATIONS = {
    "EncoderUNetModel": "raydiff.core.unet",
    "GaussianDiffusion": "raydiff.core.gaussian_diffusion",
    "LossAwareSampler": "raydiff.core.timestep_sampler",
    "LossSecondMomentResampler": "raydiff.core.timestep_sampler",
    "LossSync": "raydiff.core.timestep_sampler",
    "LossType": "raydiff.core.gaussian_diffusion",
    "ModelMeanType": "raydiff.core.gaussian_diffusion",
    "ModelVarType": "raydiff.core.gaussian_diffusion",
    "ScheduleSampler": "raydiff.core.timestep_sampler",
    "SpacedDiffusion": "raydiff.core.respace",
    "SuperResModel": "raydiff.core.unet",
    "UNetModel": "raydiff.core.unet",
    "UniformSampler": "raydiff.core.timestep_sampler",
    "approx_standard_normal_cdf": "raydiff.core.losses",
    "betas_for_alpha_bar": "raydiff.core.schedules",
    "create_named_schedule_sampler": "raydiff.core.timestep_sampler",
    "discretized_gaussian_log_likelihood": "raydiff.core.losses",
    "get_named_beta_schedule": "raydiff.core.schedules",
    "mean_flat": "raydiff.core.losses",
    "normal_kl": "raydiff.core.losses",
    "space_timesteps": "raydiff.core.respace",
    "timestep_embedding": "raydiff.core.nn_layers",
}

__all__ = sorted(_LOCATIONS)


def __getattr__(name: str) -> Any:
    if name not in _LOCATIONS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LOCATIONS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
