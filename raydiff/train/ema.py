"""Averages of the model weights a rank keeps while it trains, behind one interface
(:class:`Averager`): improved-diffusion's fixed-rate EMA (:class:`EMA`) and EDM2's post-hoc EMA
profiles (:class:`raydiff.train.posthoc_ema.PowerFunctionEMA`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import torch

logger = logging.getLogger(__name__)


class Averager(Protocol):
    """An average the rank optimiser keeps: updated after every step (``stepped``: whether the
    optimiser stepped or skipped non-finite gradients), saved with a checkpoint as its part of
    ``raydiff.train.checkpoint.load_checkpoint``'s dict (``"ema"``: weights by rate, the
    ``ema_<rate>.pt`` files; ``"trainer"``: entries of ``trainer.pt``), restored from that dict
    (``model`` holding its restored weights); it may give the weights to evaluate with."""

    def update(self, model: torch.nn.Module, *, step: int, stepped: bool = True) -> None: ...
    def saved(self, model: torch.nn.Module) -> dict[str, dict[Any, Any]]: ...
    def restore(self, checkpoint: dict[str, Any], model: torch.nn.Module) -> None: ...
    def evaluation_weights(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None: ...


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
    def update(self, model: torch.nn.Module, *, step: int = 0, stepped: bool = True) -> None:
        """Fold the model's current weights into every average (a skipped step changed none)."""
        if not stepped:
            return
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

    def saved(self, model: torch.nn.Module) -> dict[str, dict[Any, Any]]:
        return {"ema": {rate: self.state_dict_for(rate, model) for rate in self.rates}}

    def restore(self, checkpoint: dict[str, Any], model: torch.nn.Module) -> None:
        """Every rate's average; a rate the checkpoint lacks (one added to ``optim.ema_rate``
        since) starts from the restored weights, not from the weights it was built with."""
        for rate in self.rates:
            if rate in checkpoint["ema"]:
                self.load_state_dict_for(rate, checkpoint["ema"][rate])
            else:
                logger.warning(
                    "the checkpoint has no EMA at rate %s: starting it from the restored weights",
                    rate,
                )
                self.load_state_dict_for(rate, checkpoint["model"])

    def evaluation_weights(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        """The first rate's (None without rates)."""
        return self.state_dict_for(self.rates[0], model) if self.rates else None
