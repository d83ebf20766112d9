"""What the loop reports of the steps since the last report: the loss terms' means per quarter
of t (reduced over ranks when read), images/s and the data-wait share; the progress line."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from raydiff.train.task import TaskSpec

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


class ThroughputWindow:
    """Images/s, step time and data-wait share over the steps since the last ``read``.

    Only time inside steps counts (waiting for the batch + the optimiser step), so evaluation,
    sample grids, checkpoints and report barriers between steps do not dilute the figures.
    """

    def __init__(self, images_per_step: int) -> None:
        self.images_per_step = images_per_step
        self._reset()

    def _reset(self) -> None:
        self.steps, self.busy, self.data_wait = 0, 0.0, 0.0

    def begin(self) -> None:
        """Call before fetching the step's batch."""
        self._t0 = time.perf_counter()

    def data_ready(self) -> None:
        """Call once the batch is there."""
        self._t1 = time.perf_counter()

    def end(self) -> None:
        """Call after the optimiser step."""
        t2 = time.perf_counter()
        self.steps += 1
        self.busy += t2 - self._t0
        self.data_wait += self._t1 - self._t0

    def read(self) -> dict[str, float]:
        """The window's figures; starts a new window."""
        busy = max(self.busy, 1e-9)
        out = {
            "images_per_s": self.steps * self.images_per_step / busy,
            "step_time": busy / max(self.steps, 1),
            "data_wait_fraction": self.data_wait / busy,
        }
        self._reset()
        return out


def headline_fields(metrics: Mapping[str, Any], *, task: TaskSpec) -> str:
    """The task's headline metrics (then throughput and lr) that ``metrics`` holds, as the
    progress line and a run's summary show them (an eval-only step has no loss)."""
    return "  ".join(
        metric.format(metrics[metric.key])
        for metric in task.headline()
        if isinstance(metrics.get(metric.key), int | float)
    )


def format_eta(seconds: float) -> str:
    """``1h02m`` / ``4m05s`` / ``12s``."""
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
