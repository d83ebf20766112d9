"""The main rank's progress line: the metrics it shows and the time left."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from raydiff.train.task import TaskSpec


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
