"""Exponential moving averages of the model weights, one per rate, kept in fp32."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class EMA:
    """``ema = rate * ema + (1 - rate) * param`` after every optimiser step, for several rates.

    The averages are fp32 copies whatever the model's dtype (guided-diffusion's use_fp16 stores
    the UNet body in fp16; averaging in fp16 would lose the small (1 - rate) updates).
    """

    def __init__(self, model: torch.nn.Module, rates: Sequence[float]) -> None:
        self.rates = tuple(rates)
        self.names = [name for name, _ in model.named_parameters()]
        self.params = {
            rate: [p.detach().float().clone() for p in model.parameters()] for rate in self.rates
        }

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        """Fold the model's current weights into every average."""
        current = [p.detach().float() for p in model.parameters()]
        for rate, avg in self.params.items():
            torch._foreach_lerp_(avg, current, 1.0 - rate)

    def state_dict_for(self, rate: float, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """A model state dict with the averaged weights of ``rate`` (buffers from the model)."""
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for name, value in zip(self.names, self.params[rate], strict=True):
            state[name] = value.clone().to(state[name].dtype)
        return state

    def load_state_dict_for(self, rate: float, state: dict[str, torch.Tensor]) -> None:
        """Set the average of ``rate`` from a model-format state dict (e.g. an ``ema_*.pt``)."""
        missing = [name for name in self.names if name not in state]
        if missing:
            raise ValueError(f"EMA state for rate {rate} lacks parameters like {missing[:3]}")
        self.params[rate] = [state[name].detach().float().clone() for name in self.names]
