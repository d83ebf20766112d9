"""A finished sweep's results: the table, ``results.csv`` and ``best_config.yaml``. No Ray here."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from raydiff.config import ExperimentConfig, from_dict, to_yaml
from raydiff.errors import first_line
from raydiff.storage import StoragePath, as_location, write_text_atomically
from raydiff.sweep.spec import Mode


@dataclass(kw_only=True)
class TrialRow:
    """One trial as the results list it."""

    trial: str
    """The trial's folder name under ``trials/`` (its number and swept values)."""
    values: dict[str, Any]
    """Swept field (as the sweep file names it) -> the value this trial drew."""
    seed: int | None
    """The trial's ``train.seed``."""
    status: str
    """``finished`` (ran to max_steps), ``stopped early`` (by the scheduler) or ``failed: ...``."""
    step: int | None
    """The last step the trial reported metrics at."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Its last reported metrics."""
    checkpoint: str = ""
    """Its newest complete checkpoint ('' when it wrote none)."""
    run_dir: str = ""
    """Its training run folder (config.json, samples, tensorboard, checkpoints)."""


def trial_status(*, error: BaseException | str | None, step: int | None, max_steps: int) -> str:
    """What became of a trial: failed (with its error as one line), finished or stopped early."""
    if error is not None:
        return f"failed: {first_line(error) or 'unknown error'}"
    return "finished" if step is not None and step >= max_steps else "stopped early"


def best_row(rows: Sequence[TrialRow], *, metric: str, mode: Mode) -> TrialRow | None:
    """The trial with the best final ``metric`` among those that reported it (None if none)."""
    scored = [
        r for r in rows if _finite(r.metrics.get(metric)) and not r.status.startswith("failed")
    ]
    if not scored:
        return None
    pick = min if mode == "min" else max
    return pick(scored, key=lambda r: r.metrics[metric])


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _columns(
    rows: Sequence[TrialRow], metric: str, columns: Sequence[str]
) -> tuple[list[str], list[str]]:
    keys = list(dict.fromkeys(k for r in rows for k in r.values))
    # The objective first, then the task's other headline metrics that some trial reported.
    metrics = [
        m
        for m in dict.fromkeys([metric, *columns])
        if m == metric or any(m in row.metrics for row in rows)
    ]
    return keys, metrics


def format_table(
    rows: Sequence[TrialRow], *, metric: str, mode: Mode, columns: Sequence[str]
) -> str:
    """A plain-text table: trial, every swept value, the objective and the other ``columns``
    (the task's headline metrics), steps, status; the best trial marked."""
    keys, metrics = _columns(rows, metric, columns)
    best = best_row(rows, metric=metric, mode=mode)
    header = ["trial", *keys, *metrics, "steps", "status"]
    lines = [header]
    for row in rows:
        mark = " *" if row is best else ""
        lines.append(
            [
                row.trial.partition("_")[0] + mark,
                *(_show(row.values.get(k)) for k in keys),
                *(_show(row.metrics.get(m)) for m in metrics),
                _show(row.step),
                row.status,
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]
    text.insert(1, "  ".join("-" * w for w in widths))
    if best is not None:
        text.append(f"* best {metric} ({mode}): {best.trial}")
    return "\n".join(text)


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def write_csv(
    rows: Sequence[TrialRow], path: StoragePath, *, metric: str, columns: Sequence[str]
) -> StoragePath:
    """``results.csv``: one line per trial, every swept value and final metric as a column
    (the objective and ``columns`` first)."""
    keys, metrics = _columns(rows, metric, columns)
    # A reported figure named like a swept field (the loop's lr when lr is swept) would give the
    # file two columns of one name: the swept value keeps the name.
    extra = sorted({m for r in rows for m in r.metrics} - set(metrics) - set(keys))
    header = ["trial", *keys, "seed", "status", "steps", *metrics, *extra, "checkpoint", "run_dir"]
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(header)
    for r in rows:
        writer.writerow(
            [
                r.trial,
                *(r.values.get(k, "") for k in keys),
                "" if r.seed is None else r.seed,
                r.status,
                "" if r.step is None else r.step,
                *(r.metrics.get(m, "") for m in [*metrics, *extra]),
                r.checkpoint,
                r.run_dir,
            ]
        )
    write_text_atomically(path, text.getvalue())
    return path


def read_run_config(run_dir: StoragePath) -> ExperimentConfig | None:
    """The resolved config a training run saved (``config.json``), or None if it has none yet."""
    file = run_dir / "config.json"
    if not file.is_file():
        return None
    data = json.loads(file.read_text())
    return from_dict(ExperimentConfig, data)


def write_best_config(row: TrialRow, path: StoragePath, *, command: str) -> StoragePath | None:
    """``best_config.yaml``: the best trial's full training config, as ``raydiff COMMAND
    --config`` takes it (``command``: the task's training command; None when its run left no
    config)."""
    config = read_run_config(as_location(row.run_dir))
    if config is None:
        return None
    values = ", ".join(f"{k}={_show(v)}" for k, v in row.values.items())
    header = (
        f"# The best trial of this sweep ({row.trial}: {values}).\n"
        f"# Train it on: raydiff {command} --config {path} --output DIR [--max-steps N]\n"
    )
    write_text_atomically(path, header + to_yaml(config))
    return path
