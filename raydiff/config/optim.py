"""The optim section: AdamW, the learning-rate schedule and EMA."""

from __future__ import annotations

import math
from dataclasses import dataclass

from raydiff.config.field_values import invalid


@dataclass(kw_only=True, frozen=True)
class OptimConfig:
    """AdamW, learning-rate schedule and EMA (improved-diffusion's TrainLoop flags)."""

    lr: float = 1e-4
    """Peak learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    lr_anneal_steps: int = 0
    """Decay the lr linearly to 0 over this many steps (0: constant lr)."""
    warmup_steps: int = 0
    """Linear lr warm-up from 0 over this many steps."""
    grad_clip: float = 0.0
    """Clip the global gradient norm to this value (0: no clipping)."""
    ema_rate: str = "0.9999"
    """Comma-separated EMA decay rates, e.g. '0.9999,0.999'."""
    adam_betas: str = "0.9,0.999"
    """AdamW betas."""

    def __post_init__(self) -> None:
        s = "optim"
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise invalid(s, "lr", self.lr, "must be a finite number > 0")
        if self.weight_decay < 0:
            raise invalid(s, "weight_decay", self.weight_decay, "must be >= 0")
        for name in ("lr_anneal_steps", "warmup_steps"):
            if getattr(self, name) < 0:
                raise invalid(s, name, getattr(self, name), "must be >= 0")
        if self.grad_clip < 0:
            raise invalid(s, "grad_clip", self.grad_clip, "must be >= 0 (0 turns clipping off)")
        self.ema_rates()
        betas = self.adam_beta_tuple()
        if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise invalid(s, "adam_betas", self.adam_betas, "expected two numbers in [0, 1)")

    def ema_rates(self) -> tuple[float, ...]:
        """The EMA decay rates as floats."""
        if not self.ema_rate.strip():
            return ()
        try:
            rates = tuple(float(r) for r in self.ema_rate.split(","))
        except ValueError:
            raise invalid(
                "optim", "ema_rate", self.ema_rate, "expected numbers like '0.9999,0.999'"
            ) from None
        if not all(0 < r < 1 for r in rates):
            raise invalid("optim", "ema_rate", self.ema_rate, "every rate must lie in (0, 1)")
        return rates

    def adam_beta_tuple(self) -> tuple[float, ...]:
        """The AdamW betas as floats."""
        try:
            return tuple(float(b) for b in self.adam_betas.split(","))
        except ValueError:
            raise invalid("optim", "adam_betas", self.adam_betas, "expected '0.9,0.999'") from None
