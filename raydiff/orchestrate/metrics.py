"""raydiff's training metrics on Ray's metrics system: the dashboard's Metrics view and Prometheus.

Rank 0's ``RayRuntime.report`` hands every report of the loop (``raydiff.train.loop``) to
:class:`TrainingMetrics`, which sets one ``ray.util.metrics.Gauge`` per figure, tagged with the
run's name (``run``). Ray's metrics agent on each node serves them at
``http://NODE:METRICS_EXPORT_PORT/metrics`` (``ray.nodes()[i]["MetricsExportPort"]``) with Ray's
``ray_`` namespace in front: ``raydiff_loss`` is scraped as ``ray_raydiff_loss{run="..."}``. The
agent exports every few seconds, and a gauge keeps its last value after the run ends.

Every figure is a gauge, the counts included: ``step`` and ``skipped_steps`` are the run's totals,
restored from its checkpoint when it resumes, while a Ray counter is per worker process and would
start again from zero in a restarted worker group.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from ray.util.metrics import Gauge

from raydiff.core.timestep_sampler import ScheduleSampler, UniformSampler
from raydiff.train.task import Metric, TaskSpec

PREFIX = "raydiff_"
RUN_TAG = "run"

SAMPLER: dict[str, str] = {
    "sampler_weight_min": "Loss-aware timestep sampler: smallest p_t * T (1 = uniform)",
    "sampler_weight_max": "Loss-aware timestep sampler: largest p_t * T (1 = uniform)",
    "sampler_entropy": "Loss-aware timestep sampler: entropy of p_t over log T (1 = uniform)",
}


WORKERS = (
    "workers",
    "Training workers (DDP ranks) of the running worker group: an elastic run's current size",
)
"""Set when a worker group starts: a resized elastic run starts a new group of the new size."""


def gauges(task: TaskSpec) -> dict[str, Metric]:
    """The report keys of a run of ``task`` that become gauges, and their metrics: the loop's
    and the task's figures that name a gauge. Absent keys leave their gauge as it was (an
    evaluation-only report carries ``step`` and ``val_*`` only)."""
    return {m.key: m for m in task.all_metrics() if m.gauge}


def metric_names(task: TaskSpec) -> list[str]:
    """Every metric a run of ``task`` exports, as registered (Prometheus adds ``ray_`` in
    front)."""
    names = [m.gauge for m in gauges(task).values()] + [*SAMPLER, WORKERS[0]]
    return [PREFIX + name for name in names]


def sampler_summary(weights: np.ndarray) -> dict[str, float]:
    """Min, max (as multiples of the uniform probability 1/T) and normalised entropy of the
    sampler's distribution p_t = w_t / sum(w)."""
    p = np.asarray(weights, dtype=np.float64)
    p = p / p.sum()
    num_timesteps = p.size
    nonzero = p[p > 0]
    entropy = float(-(nonzero * np.log(nonzero)).sum())
    # Clipped: rounding can put a uniform distribution a hair above 1.
    normalised = min(entropy / math.log(num_timesteps), 1.0) if num_timesteps > 1 else 1.0
    return {
        "sampler_weight_min": float(p.min()) * num_timesteps,
        "sampler_weight_max": float(p.max()) * num_timesteps,
        "sampler_entropy": normalised,
    }


class TrainingMetrics:
    """One run's gauges, tagged ``run=run_name``. Create and publish on one rank only (rank 0):
    the figures are already reduced over all workers."""

    def __init__(self, run_name: str, *, task: TaskSpec, world_size: int) -> None:
        self.run_name = run_name
        tags = {RUN_TAG: run_name}
        self._gauges: dict[str, Gauge] = {}
        for key, metric in gauges(task).items():
            self._gauges[key] = _gauge(metric.gauge, metric.description, tags)
        for name, description in SAMPLER.items():
            self._gauges[name] = _gauge(name, description, tags)
        _gauge(*WORKERS, tags).set(float(world_size))

    def publish(self, report: Mapping[str, Any], *, sampler: ScheduleSampler | None = None) -> None:
        """Set the gauges of the figures in ``report`` (the loop's report dict) and, for a
        loss-aware ``sampler``, the summaries of its current weights."""
        values = {key: report[key] for key in self._gauges if key in report}
        if sampler is not None and not isinstance(sampler, UniformSampler):
            values.update(sampler_summary(sampler.weights()))
        for key, value in values.items():
            self._gauges[key].set(float(value))


def _gauge(name: str, description: str, tags: dict[str, str]) -> Gauge:
    gauge = Gauge(PREFIX + name, description=description, tag_keys=(RUN_TAG,))
    gauge.set_default_tags(tags)
    return gauge
