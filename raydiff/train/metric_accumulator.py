"""Running sums of the step metrics between two reports, reduced over ranks when read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from raydiff.train.rank_optimizer import StepResult


@dataclass
class MetricAccumulator:
    """Running sums of the step metrics between two reports.

    Sums stay tensors on the training device, so adding a step costs no host sync (that matters
    on GPU); they are read once per report in ``flush``.
    """

    num_timesteps: int
    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    counts: dict[str, torch.Tensor] = field(default_factory=dict)

    def _add(self, name: str, value: torch.Tensor, count: torch.Tensor) -> None:
        value, count = value.detach().double(), count.detach().double()
        if name in self.sums:
            self.sums[name] += value
            self.counts[name] += count
        else:
            self.sums[name], self.counts[name] = value.clone(), count.clone()

    def add_step(self, result: StepResult) -> None:
        # improved-diffusion's log_loss_dict: each term's mean, and its mean per quartile of t,
        # of the importance-weighted terms (what the step optimises; with a non-uniform sampler
        # the raw terms over-count the timesteps it draws most).
        quartile = (4 * result.timesteps // self.num_timesteps).clamp(max=3)
        onehot = torch.nn.functional.one_hot(quartile, 4).double()  # [B, 4]
        weights = result.weights.double()
        for key, values in result.losses.items():
            values = values.double() * weights
            # Slot 0: the whole batch; slots 1-4: quartiles (present even when empty, so that all
            # ranks reduce the same keys).
            sums = torch.cat([values.sum().view(1), values @ onehot])  # [5]
            counts = torch.cat([torch.ones_like(values).sum().view(1), onehot.sum(0)])
            self._add(key, sums, counts)
        if result.stepped:
            self._add(
                "grad_norm", result.grad_norm.view(1), torch.ones(1, device=result.grad_norm.device)
            )

    def flush(
        self, reduce: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None
    ) -> dict[str, float]:
        """Means since the last flush; ``reduce`` sums the totals over workers first."""
        packed = {f"s:{k}": v for k, v in self.sums.items()}
        packed.update({f"n:{k}": v for k, v in self.counts.items()})
        self.sums, self.counts = {}, {}
        if reduce is not None:
            packed = reduce(packed)
        out: dict[str, float] = {}
        for key in sorted(k[2:] for k in packed if k.startswith("s:")):
            sums = packed[f"s:{key}"].cpu().tolist()
            counts = packed[f"n:{key}"].cpu().tolist()
            names = [key] if len(sums) == 1 else [key, *(f"{key}_q{q}" for q in range(4))]
            for name, total, count in zip(names, sums, counts, strict=True):
                # A bin that no sample fell into has no mean: leave it out rather than report 0.
                if count > 0:
                    out[name] = total / count
        return out
