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

PREFIX = "raydiff_"
RUN_TAG = "run"

REPORTED: dict[str, tuple[str, str]] = {
    # report key: (metric name without the prefix, description)
    "step": ("step", "Optimiser steps taken (the run's total)"),
    "epoch": ("epoch", "Training epoch"),
    "loss": (
        "loss",
        "Training loss, importance-weighted mean over all workers since the last report",
    ),
    "mse": ("mse", "Epsilon (or x0) MSE term of the training loss"),
    "vb": ("vb", "Variational-bound term of the training loss (learned sigma)"),
    "grad_norm": ("grad_norm", "Gradient norm, mean over the steps since the last report"),
    "images_per_s": ("images_per_second", "Training throughput, images/s over all workers"),
    "step_time": ("step_time_seconds", "Wall time per step (data wait + optimiser step)"),
    "data_wait_fraction": ("data_wait_fraction", "Share of the step time spent waiting for data"),
    "lr": ("learning_rate", "Learning rate of the last step"),
    "loss_scale": ("loss_scale", "fp16 gradient scaler's loss scale (1 without fp16)"),
    "skipped_steps": ("skipped_steps", "Steps skipped for non-finite gradients (run total)"),
    "val_bpd": ("val_bpd", "Validation bits/dim of the EMA weights"),
    "val_mse": ("val_mse", "Validation MSE of the EMA weights"),
}
"""Which keys of the loop's report become gauges. Absent keys leave their gauge as it was (an
evaluation-only report carries ``step`` and ``val_*`` only)."""

CLASSIFIER_REPORTED: dict[str, tuple[str, str]] = {
    "acc@1": ("accuracy_top1", "Classifier: top-1 accuracy on the training batches (x_t)"),
    "acc@5": ("accuracy_top5", "Classifier: top-5 accuracy on the training batches (x_t)"),
    "val_loss": ("val_loss", "Classifier: validation cross-entropy"),
    "val_acc@1": ("val_accuracy_top1", "Classifier: validation top-1 accuracy (x_t)"),
    "val_acc@5": ("val_accuracy_top5", "Classifier: validation top-5 accuracy (x_t)"),
    "val_acc@1_t0": ("val_accuracy_top1_t0", "Classifier: validation top-1 accuracy at t = 0"),
}
"""The figures only a classifier (``train.task=classifier``) reports, as gauges too."""
REPORTED.update(CLASSIFIER_REPORTED)

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


def metric_names() -> list[str]:
    """Every metric this module exports, as registered (Prometheus adds ``ray_`` in front)."""
    names = [name for name, _ in REPORTED.values()] + [*SAMPLER, WORKERS[0]]
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

    def __init__(self, run_name: str, *, world_size: int) -> None:
        self.run_name = run_name
        tags = {RUN_TAG: run_name}
        self._gauges: dict[str, Gauge] = {}
        for key, (name, description) in REPORTED.items():
            self._gauges[key] = _gauge(name, description, tags)
        for name, description in SAMPLER.items():
            self._gauges[name] = _gauge(name, description, tags)
        _gauge(*WORKERS, tags).set(float(world_size))

    def publish(self, report: Mapping[str, Any], *, sampler: ScheduleSampler | None = None) -> None:
        """Set the gauges of the figures in ``report`` (the loop's report dict) and, for a
        loss-aware ``sampler``, the summaries of its current weights."""
        values = {key: report[key] for key in REPORTED if key in report}
        if sampler is not None and not isinstance(sampler, UniformSampler):
            values.update(sampler_summary(sampler.weights()))
        for key, value in values.items():
            self._gauges[key].set(float(value))


def _gauge(name: str, description: str, tags: dict[str, str]) -> Gauge:
    gauge = Gauge(PREFIX + name, description=description, tag_keys=(RUN_TAG,))
    gauge.set_default_tags(tags)
    return gauge
