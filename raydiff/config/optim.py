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
    posthoc_ema_stds: str = ""
    """Post-hoc EMA (EDM2, Karras et al. 2024): comma-separated relative standard deviations
    (sigma_rel) of the power-function EMA profiles to track, e.g. '0.05,0.10' (EDM2's); empty:
    off. Snapshots of them let ``raydiff ema`` reconstruct any length after training."""
    posthoc_ema_interval: int = 0
    """Steps between post-hoc EMA snapshots (0: every ``train.save_interval`` steps)."""

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
        self.posthoc_sigma_rels()
        if self.posthoc_ema_interval < 0:
            raise invalid(
                s,
                "posthoc_ema_interval",
                self.posthoc_ema_interval,
                "must be >= 0 (0: save_interval)",
            )
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

    def posthoc_sigma_rels(self) -> tuple[float, ...]:
        """The tracked post-hoc EMA profiles' sigma_rel as floats (empty: off)."""
        text = self.posthoc_ema_stds.strip()
        if not text:
            return ()
        try:
            stds = tuple(float(v) for v in text.split(","))
        except ValueError:
            raise invalid(
                "optim", "posthoc_ema_stds", text, "expected numbers like '0.05,0.10'"
            ) from None
        # EDM2 eq. 123: a power-function profile (exponent > -1) has a relative std below 0.30.
        if not all(0 < v < 0.3 for v in stds) or len(set(stds)) != len(stds):
            raise invalid(
                "optim",
                "posthoc_ema_stds",
                text,
                "expected distinct relative standard deviations in (0, 0.3), e.g. '0.05,0.10'",
            )
        return stds

    def adam_beta_tuple(self) -> tuple[float, ...]:
        """The AdamW betas as floats."""
        try:
            return tuple(float(b) for b in self.adam_betas.split(","))
        except ValueError:
            raise invalid("optim", "adam_betas", self.adam_betas, "expected '0.9,0.999'") from None
