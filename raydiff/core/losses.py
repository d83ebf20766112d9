"""Likelihood helpers of the variational bound: Gaussian KL and the discretised decoder NLL.

All functions work elementwise in nats; ``GaussianDiffusion`` averages them and converts to bits.
"""

from __future__ import annotations

import numpy as np
import torch


def mean_flat(tensor: torch.Tensor) -> torch.Tensor:
    """Mean over every dimension but the batch one: ``[B, ...] -> [B]``."""
    return tensor.mean(dim=list(range(1, tensor.ndim)))


def normal_kl(
    mean1: torch.Tensor | float,
    logvar1: torch.Tensor | float,
    mean2: torch.Tensor | float,
    logvar2: torch.Tensor | float,
) -> torch.Tensor:
    """KL(N(mean1, exp(logvar1)) || N(mean2, exp(logvar2))), elementwise, in nats.

    Scalars broadcast against the tensor arguments; at least one argument must be a tensor.
    """
    tensor = next(
        (obj for obj in (mean1, logvar1, mean2, logvar2) if isinstance(obj, torch.Tensor)), None
    )
    if tensor is None:
        raise TypeError("normal_kl needs at least one tensor argument")
    # Scalars become tensors on the same device/dtype so torch.exp works on them.
    logvar1, logvar2 = (
        x if isinstance(x, torch.Tensor) else torch.tensor(x).to(tensor) for x in (logvar1, logvar2)
    )
    return 0.5 * (
        -1.0
        + logvar2
        - logvar1
        + torch.exp(logvar1 - logvar2)
        + ((mean1 - mean2) ** 2) * torch.exp(-logvar2)
    )


def approx_standard_normal_cdf(x: torch.Tensor) -> torch.Tensor:
    """The tanh approximation of the standard normal CDF used by the reference decoder."""
    return 0.5 * (1.0 + torch.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * torch.pow(x, 3))))


def discretized_gaussian_log_likelihood(
    x: torch.Tensor, *, means: torch.Tensor, log_scales: torch.Tensor
) -> torch.Tensor:
    """Log-likelihood of ``x`` (uint8 data scaled to [-1, 1]) under a discretised Gaussian.

    Each pixel value owns a bin of half-width 1/255; the outermost bins extend to -inf / +inf
    (the branches at x < -0.999 and x > 0.999). This is the decoder L_0 of DDPM eq. 13.
    Returns elementwise log-probabilities in nats, shape of ``x``.
    """
    if not x.shape == means.shape == log_scales.shape:
        raise ValueError(
            f"x, means and log_scales must have one shape, got {tuple(x.shape)}, "
            f"{tuple(means.shape)}, {tuple(log_scales.shape)}"
        )
    centered_x = x - means
    inv_stdv = torch.exp(-log_scales)
    plus_in = inv_stdv * (centered_x + 1.0 / 255.0)
    cdf_plus = approx_standard_normal_cdf(plus_in)
    min_in = inv_stdv * (centered_x - 1.0 / 255.0)
    cdf_min = approx_standard_normal_cdf(min_in)
    # The clamps keep log() finite where a bin's probability underflows.
    log_cdf_plus = torch.log(cdf_plus.clamp(min=1e-12))
    log_one_minus_cdf_min = torch.log((1.0 - cdf_min).clamp(min=1e-12))
    cdf_delta = cdf_plus - cdf_min
    return torch.where(
        x < -0.999,
        log_cdf_plus,
        torch.where(x > 0.999, log_one_minus_cdf_min, torch.log(cdf_delta.clamp(min=1e-12))),
    )
