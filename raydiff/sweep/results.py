"""A finished sweep's results: the table, ``results.csv`` and ``best_config.yaml``. No Ray here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from raydiff.config import ExperimentConfig, to_yaml
from raydiff.config.resolve import saved_config
from raydiff.errors import first_line
from raydiff.results_table import Ranking, cell, csv_text, text_table
from raydiff.storage import StoragePath, as_location, write_text_atomically


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


def best_row(rows: Sequence[TrialRow], ranking: Ranking) -> TrialRow | None:
    """The trial with the best final metric among those that reported it and did not fail."""
    return ranking.best(r for r in rows if not r.status.startswith("failed"))


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


def format_table(rows: Sequence[TrialRow], ranking: Ranking, *, columns: Sequence[str]) -> str:
    """A plain-text table: trial, every swept value, the objective and the other ``columns``
    (the task's headline metrics), steps, status; the best trial marked."""
    keys, metrics = _columns(rows, ranking.key, columns)
    best = best_row(rows, ranking)
    lines = [["trial", *keys, *metrics, "steps", "status"]]
    for row in rows:
        lines.append(
            [
                row.trial.partition("_")[0] + (" *" if row is best else ""),
                *(cell(row.values.get(k)) for k in keys),
                *(cell(row.metrics.get(m)) for m in metrics),
                cell(row.step),
                row.status,
            ]
        )
    text = text_table(lines, rule=True)
    if best is not None:
        text.append(f"* best {ranking.key} ({ranking.mode}): {best.trial}")
    return "\n".join(text)


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
    lines = (
        [
            r.trial,
            *(r.values.get(k) for k in keys),
            r.seed,
            r.status,
            r.step,
            *(r.metrics.get(m) for m in [*metrics, *extra]),
            r.checkpoint,
            r.run_dir,
        ]
        for r in rows
    )
    write_text_atomically(path, csv_text(header, lines))
    return path


def read_run_config(run_dir: StoragePath) -> ExperimentConfig | None:
    """The resolved config a training run saved (``config.json``), or None if it has none yet."""
    return saved_config(run_dir) if (run_dir / "config.json").is_file() else None


def write_best_config(row: TrialRow, path: StoragePath, *, command: str) -> StoragePath | None:
    """``best_config.yaml``: the best trial's full training config, as ``raydiff COMMAND
    --config`` takes it (``command``: the task's training command; None when its run left no
    config)."""
    config = read_run_config(as_location(row.run_dir))
    if config is None:
        return None
    values = ", ".join(f"{k}={cell(v)}" for k, v in row.values.items())
    header = (
        f"# The best trial of this sweep ({row.trial}: {values}).\n"
        f"# Train it on: raydiff {command} --config {path} --output DIR [--max-steps N]\n"
    )
    write_text_atomically(path, header + to_yaml(config))
    return path
