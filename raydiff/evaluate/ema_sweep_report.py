"""The results of ``raydiff ema --evaluate``: a table of every EMA length's figures, its CSV and a
plot of the ranking metric against sigma_rel. No Ray here.

Each row is one set of weights of a checkpoint: a length reconstructed from the run's post-hoc
EMA snapshots (``phema_0.080``), or a fixed-rate EMA the run tracked (``ema_0.9999``), drawn at
the length it has at the checkpoint's step (:func:`raydiff.train.posthoc_ema.rate_to_sigma_rel`).
The best row by the ranking metric is marked and named.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

from raydiff.results_table import Ranking, cell, csv_text, finite, text_table
from raydiff.storage import StoragePath, write_bytes_atomically, write_text_atomically

CSV_NAME = "sweep.csv"
PLOT_NAME = "sweep.png"


@dataclass(frozen=True, kw_only=True)
class SweepRow:
    """One set of weights and its figures."""

    name: str
    """The ``--weights`` name: ``phema_0.080`` or ``ema_0.9999``."""
    sigma_rel: float
    """Its length (a fixed-rate EMA's: the one it has at the checkpoint's step)."""
    rate: float | None = None
    """The EMA rate it stands for (``--rate``, or a fixed-rate EMA's), if any."""
    fixed: bool = False
    """The checkpoint's own fixed-rate EMA, not a reconstruction."""
    error: float | None = None
    """The relative reconstruction error of its profile (None: not reconstructed)."""
    metrics: dict[str, float | None] = field(default_factory=dict)
    """Its figures by column name (``fd_classifier``, ``val_bpd``, ``val_acc@1``...)."""


@dataclass(frozen=True, kw_only=True)
class SweepReport:
    """What was written, and the best weights (None when no row has a finite ranking value)."""

    table: str
    csv: StoragePath
    plot: StoragePath
    best: SweepRow | None


def metric_columns(rows: list[SweepRow]) -> list[str]:
    """Every metric some row has, in the order they first appear."""
    return list(dict.fromkeys(key for row in rows for key in row.metrics))


def sweep_csv(rows: list[SweepRow], ranking: Ranking) -> str:
    """One line per row, full precision (empty cells for missing values); ``best`` is 1 on the
    best row."""
    best = ranking.best(rows)
    columns = metric_columns(rows)
    header = ["weights", "sigma_rel", "rate", *columns, "reconstruction_error", "best"]
    lines = (
        [
            row.name,
            row.sigma_rel,
            row.rate,
            *(None if row.metrics.get(c) is None else float(row.metrics[c]) for c in columns),
            row.error,
            int(row is best),
        ]
        for row in rows
    )
    return csv_text(header, lines)


def format_table(rows: list[SweepRow], ranking: Ranking) -> str:
    """The rows as an aligned text table, the best marked ``*``, and a line naming it."""
    best = ranking.best(rows)
    columns = metric_columns(rows)
    lines = [["", "weights", "sigma_rel", "rate", *columns, "recon_error"]]
    for row in rows:
        lines.append(
            [
                "*" if row is best else "",
                row.name,
                f"{row.sigma_rel:.4f}",
                "" if row.rate is None else f"{row.rate:g}",
                *(cell(row.metrics.get(c)) for c in columns),
                "" if row.error is None else f"{row.error:.1e}",
            ]
        )
    text = text_table(lines)
    if best is None:
        text.append(f"best: none (no weights has a finite {ranking.key})")
    else:
        value = cell(best.metrics[ranking.key])
        text.append(
            f"best: {best.name} (sigma_rel {best.sigma_rel:.4f}), {ranking.key} {value} "
            f"({ranking.better} is better)"
        )
    return "\n".join(text)


def plot_png(rows: list[SweepRow], ranking: Ranking, *, title: str) -> bytes:
    """The ranking metric against sigma_rel: the reconstructed lengths as a line, the fixed-rate
    EMAs as marked points at their lengths, the best circled. PNG bytes."""
    # Imported here: only a sweep draws, and matplotlib takes a second to import.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 4.2), dpi=100)
    FigureCanvasAgg(figure)  # the Agg canvas: no display, no global pyplot state
    axes = figure.add_subplot()
    points = [(r, r.metrics.get(ranking.key)) for r in rows]
    lengths = sorted((r.sigma_rel, float(v)) for r, v in points if not r.fixed and finite(v))
    if lengths:
        axes.plot(*zip(*lengths, strict=True), marker="o", label="post-hoc EMA (reconstructed)")
    fixed = [(row, value) for row, value in points if row.fixed and finite(value)]
    for index, (row, value) in enumerate(fixed):
        label = "fixed-rate EMA (its length at the step)" if index == 0 else None
        axes.scatter([row.sigma_rel], [value], marker="s", color="tab:red", zorder=3, label=label)
        axes.annotate(row.name, (row.sigma_rel, value), textcoords="offset points", xytext=(5, 5))
    best = ranking.best(rows)
    if best is not None:
        axes.scatter(
            [best.sigma_rel],
            [best.metrics[ranking.key]],
            s=160,
            facecolors="none",
            edgecolors="black",
            zorder=4,
            label=f"best: {best.name}",
        )
    axes.set_xlabel("sigma_rel (EMA length relative to training time)")
    axes.set_ylabel(f"{ranking.key} ({ranking.better} is better)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    if lengths or fixed or best is not None:
        axes.legend(loc="best", fontsize="small")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def write_sweep_report(
    folder: StoragePath, rows: list[SweepRow], ranking: Ranking, *, title: str
) -> SweepReport:
    """Write ``sweep.csv`` and ``sweep.png`` into ``folder`` (a local path or a URI),
    atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    csv_path = folder / CSV_NAME
    plot_path = folder / PLOT_NAME
    write_text_atomically(csv_path, sweep_csv(rows, ranking))
    write_bytes_atomically(plot_path, plot_png(rows, ranking, title=title))
    return SweepReport(
        table=format_table(rows, ranking),
        csv=csv_path,
        plot=plot_path,
        best=ranking.best(rows),
    )
