"""The optimiser raydiff trains with: AdamW from an :class:`~raydiff.config.OptimConfig`."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from raydiff.config import OptimConfig

__all__ = ["build_optimizer"]


def build_optimizer(
    params: Iterable[torch.nn.Parameter], *, optim: OptimConfig
) -> torch.optim.AdamW:
    """AdamW with the config's lr, weight decay and betas (improved-diffusion's optimiser).

    Uses the fused implementation (one kernel for all parameters instead of ~10 ops per
    parameter: 3x faster on CPU here, and available on CUDA). The learning-rate schedule is the
    trainer's job; this sets the peak lr.
    """
    beta1, beta2 = optim.adam_beta_tuple()
    return torch.optim.AdamW(
        params, lr=optim.lr, weight_decay=optim.weight_decay, betas=(beta1, beta2), fused=True
    )
