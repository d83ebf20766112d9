"""raydiff's training metrics on Ray's metrics system: the dashboard's Metrics view and Prometheus
(docs/operations.md).

Rank 0's ``RayRuntime.report`` hands every report of the loop (``raydiff.train.loop``) to
:class:`TrainingMetrics`, which sets one ``ray.util.metrics.Gauge`` per figure, tagged with the
run's name (``run``); Ray's metrics agent exports them with Ray's ``ray_`` prefix in front. Every
figure is a gauge, the counts included: ``step`` and ``skipped_steps`` are the run's totals,
restored from its checkpoint when it resumes, while a Ray counter is per worker process and would
start again from zero in a restarted worker group. The run's failures and preemptions are
counted in Ray Train's controller (:class:`RunEventMetrics`). raydiff's Grafana dashboard
(``raydiff/dashboards/``) charts every gauge.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import ray.train
from ray.exceptions import RayActorError
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

RUN_EVENTS: dict[str, str] = {
    "failures": "Worker-group failures of the run (a raised error, a lost worker or node), each "
    "one Ray Train restarted the group after or ended the run on; preemptions apart",
    "preemptions": "Worker groups of the run stopped by a node preemption (a drained node)",
}
"""Counted in Ray Train's controller by :class:`RunEventMetrics`."""


def gauges(task: TaskSpec) -> dict[str, Metric]:
    """The report keys of a run of ``task`` that become gauges, and their metrics: the loop's
    and the task's figures that name a gauge. Absent keys leave their gauge as it was (an
    evaluation-only report carries ``step`` and ``val_*`` only)."""
    return {m.key: m for m in task.all_metrics() if m.gauge}


def metric_names(task: TaskSpec) -> list[str]:
    """Every metric a run of ``task`` exports, as registered (Prometheus adds ``ray_`` in
    front)."""
    names = [m.gauge for m in gauges(task).values()] + [*SAMPLER, WORKERS[0], *RUN_EVENTS]
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
        self._gauges = {
            key: _gauge(m.gauge, m.description, tags) for key, m in gauges(task).items()
        }
        self._gauges |= {name: _gauge(name, text, tags) for name, text in SAMPLER.items()}
        _gauge(*WORKERS, tags).set(float(world_size))

    def publish(self, report: Mapping[str, Any], *, sampler: ScheduleSampler | None = None) -> None:
        """Set the gauges of the figures in ``report`` (the loop's report dict) and, for a
        loss-aware ``sampler``, the summaries of its current weights."""
        values = {key: report[key] for key in self._gauges if key in report}
        if sampler is not None and not isinstance(sampler, UniformSampler):
            values.update(sampler_summary(sampler.weights()))
        for key, value in values.items():
            self._gauges[key].set(float(value))


class RunEventMetrics(ray.train.UserCallback):
    """The run's failures and preemptions as gauges tagged ``run=run_name``, counted in Ray
    Train's controller, where one instance lives for the whole ``fit()``.

    ``after_exception`` is called with a worker group's errors each time the controller polls a
    group that has some. A failure is decided on at its first poll (the group restarts or the
    run ends), so each call is one failure. A preemption is one when a worker died with its node
    preempted (what Ray Train itself tells a preemption by); the controller keeps polling the
    stopping group while the preempted node drains, so the calls until the next group reports
    are the same preemption. Both gauges are set at every report too, so a run without faults
    shows zeros rather than nothing (two preemptions before a restarted group's first report
    count once).
    """

    def __init__(self, run_name: str) -> None:
        self.run_name = run_name
        self.counts = dict.fromkeys(RUN_EVENTS, 0)
        self._preempting = False
        self._gauges: dict[str, Gauge] | None = None  # made in the controller, at first use

    def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        self._preempting = False  # a group that reports has started after any preemption
        self._publish()

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        # A worker's death with a preempted node: Ray Train's own test of a preemption.
        preempted = any(
            isinstance(error, RayActorError) and error.preempted
            for error in worker_exceptions.values()
        )
        if preempted and self._preempting:
            return  # the stopping group polled again
        self._preempting = preempted
        self.counts["preemptions" if preempted else "failures"] += 1
        self._publish()

    def _publish(self) -> None:
        if self._gauges is None:
            tags = {RUN_TAG: self.run_name}
            self._gauges = {name: _gauge(name, text, tags) for name, text in RUN_EVENTS.items()}
        for name, count in self.counts.items():
            self._gauges[name].set(float(count))


def _gauge(name: str, description: str, tags: dict[str, str]) -> Gauge:
    gauge = Gauge(PREFIX + name, description=description, tag_keys=(RUN_TAG,))
    gauge.set_default_tags(tags)
    return gauge
