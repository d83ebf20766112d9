"""Ranked results: rows of figures, the best row by one metric and its direction, a text table
and CSV. A sweep's ``results.csv``, ``raydiff ema --evaluate``'s ``sweep.csv`` and a family's
``report.csv`` are written with it. Like :mod:`raydiff.errors`, it imports nothing else of
raydiff, so any layer may rank.
"""

from __future__ import annotations

import csv
import io
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

Mode = Literal["min", "max"]
"""Which way a metric is better: ``min`` (a loss, bits/dim, FD) or ``max`` (an accuracy)."""


class Row(Protocol):
    """A row of results: its figures by metric name."""

    @property
    def metrics(self) -> Mapping[str, Any]: ...


RowT = TypeVar("RowT", bound=Row)


@dataclass(frozen=True, kw_only=True)
class Ranking:
    """The metric rows are ranked by, and which way is better."""

    key: str
    mode: Mode

    @property
    def better(self) -> str:
        return "lower" if self.mode == "min" else "higher"

    def best(self, rows: Iterable[RowT]) -> RowT | None:
        """The row with the best finite value of the metric (the first of equals; None when no
        row has one)."""
        scored = [row for row in rows if finite(row.metrics.get(self.key))]
        sign = 1.0 if self.mode == "min" else -1.0
        return min(scored, key=lambda row: sign * float(row.metrics[self.key]), default=None)


def finite(value: Any) -> bool:
    """A number that is not NaN or infinite (a figure a row can be ranked by)."""
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    return real and math.isfinite(value)


def cell(value: Any) -> str:
    """A figure as a table shows it: ``-`` when missing, a float to 4 significant digits."""
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def text_table(lines: Sequence[Sequence[str]], *, rule: bool = False) -> list[str]:
    """``lines`` (a header, then the rows) in columns two spaces apart, trailing blanks dropped;
    ``rule``: a line of dashes under the header."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    text = [
        "  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]
    if rule:
        text.insert(1, "  ".join("-" * width for width in widths))
    return text


def csv_text(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """The header and rows as CSV (one line each; None an empty cell, floats at full
    precision)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()
