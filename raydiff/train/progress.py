"""The main rank's progress line: the metrics it shows and the time left."""

from __future__ import annotations

import math
from typing import Any


def progress_fields(metrics: dict[str, Any]) -> str:
    """The metrics a progress line shows, those present only (an eval-only step has no loss)."""
    fields = []
    for key, fmt in (
        ("loss", "loss {:.4f}"),
        ("mse", "mse {:.4f}"),
        ("acc@1", "acc@1 {:.3f}"),
        ("val_bpd", "val_bpd {:.3f}"),
        ("val_acc@1", "val_acc@1 {:.3f}"),
        ("images_per_s", "{:.0f} img/s"),
        ("lr", "lr {:.2e}"),
    ):
        if key in metrics:
            fields.append(fmt.format(metrics[key]))
    return "  ".join(fields)


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
