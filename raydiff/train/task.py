"""What a kind of model brings to the one training loop: the seam between the loop and a task.

The loop (:mod:`raydiff.train.loop`) owns everything every task shares: steps and microbatches,
precision and loss scaling, the timestep sampler, EMA, checkpoints and resume, metrics,
TensorBoard and reporting. A :class:`Task` owns what differs: its model, its loss on a batch,
its validation and its preview. The diffusion model is one (:mod:`raydiff.train.tasks.diffusion`);
a noisy classifier (cross-entropy of labels on ``q_sample``'d images, accuracy as validation, no
preview) or a super-resolution model (the low-resolution input built from the batch) is another
class with the same members, whose factory is handed to ``run_loop`` as its ``make_task``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

import torch

from raydiff.core.gaussian_diffusion import GaussianDiffusion
from raydiff.results_table import Mode
from raydiff.train.runtime import Batch, Runtime, ValBatches

if TYPE_CHECKING:
    from raydiff.config import ExperimentConfig

__all__ = ["Batch", "Losses", "Metric", "Task", "TaskFactory", "TaskSpec", "ValBatches"]

Losses = Callable[[torch.nn.Module, Batch, torch.Tensor], dict[str, torch.Tensor]]
"""``losses(model, batch, t)``: per-sample terms of a (micro)batch on the device at timesteps
``t``; ``loss`` is the term optimised, every term is logged (mean and per quarter of t)."""


class Task(Protocol):
    """One kind of model the loop trains. Built by a :data:`TaskFactory` after the loop seeded
    torch's generator from ``train.seed``, so every rank builds the same initial weights."""

    model: torch.nn.Module
    """The unwrapped module, on the CPU; the runtime moves it and wraps it for data parallelism,
    the loop keeps its EMA and checkpoints its ``state_dict``."""

    diffusion: GaussianDiffusion
    """The noise process: the timestep sampler draws from its ``num_timesteps``."""

    preview_columns: int | None
    """Columns of the preview grid (None: about the square root of the image count)."""

    def losses(
        self, model: torch.nn.Module, batch: Batch, t: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """See :data:`Losses`. ``model`` is the (possibly DDP-wrapped) module to call; ``batch``
        holds every key of the runtime's batch, sliced to the microbatch; ``t`` int64 [B]."""
        ...

    def evaluate(
        self, model: torch.nn.Module, batches: ValBatches, *, seed: int
    ) -> dict[str, torch.Tensor]:
        """Totals over this rank's validation batches, ``count`` (images) among them. The loop
        calls it on every rank with the evaluation weights loaded and ``model`` in eval mode, then
        sums the totals over ranks. ``seed`` keys this rank's noise: the same at every
        evaluation."""
        ...

    def evaluation_metrics(self, totals: dict[str, torch.Tensor]) -> dict[str, float]:
        """The reported metrics from :meth:`evaluate`'s totals summed over ranks (count > 0)."""
        ...

    def preview(self, model: torch.nn.Module, *, seed: int) -> torch.Tensor | None:
        """Images ``[N, C, H, W]`` in [-1, 1] drawn with the evaluation weights (main rank only,
        no collective), or None for a task without a preview. ``seed``: the same every time, so
        previews are comparable over a run."""
        ...


class TaskFactory(Protocol):
    """Builds a run's task. The loop calls it once on every rank, after seeding torch's generator
    and before the runtime wraps the model. ``runtime`` is there for a task whose preview needs
    inputs (a super-resolution model's low-resolution images: ``runtime.val_batches``, called
    on every rank alike); most tasks need only ``config``."""

    def __call__(self, config: ExperimentConfig, *, runtime: Runtime) -> Task: ...


PosthocSweep = Literal["samples", "validation"]


@dataclass(frozen=True, kw_only=True)
class Metric:
    """One figure the loop reports for a task: how it is shown, exported and swept."""

    key: str
    """The name in the loop's reports, TensorBoard (``train/<key>``, ``val/...``) and sweeps."""
    description: str
    """One line: what it measures (the Prometheus gauge's help text)."""
    display: str = ""
    """How the progress line and the run summary print it (default ``"<key> {:.4g}"``)."""
    gauge: str = ""
    """Its Prometheus gauge's name without ``raydiff_`` ('': not exported as a gauge)."""
    objective: Mode | None = None
    """A sweep may optimise it, in this direction (None: not an objective)."""
    headline: bool = False
    """Shown in the progress line, the run summary and the sweep's results table."""

    def format(self, value: float) -> str:
        """``value`` as the progress line and the summary print it."""
        return (self.display or f"{self.key} {{:.4g}}").format(value)


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """Everything the rest of raydiff asks of a task, declared once in its module of
    :mod:`raydiff.train.tasks` (as torchtitan's ``TrainSpec`` is for a model family): the
    progress line, the Prometheus gauges, a sweep's objectives, rows and columns, the CLI's
    summary, the start-up line and the checkpoint loaders all read it."""

    name: str
    """``train.task``'s value."""
    build: TaskFactory
    """The loop's task factory."""
    network: Callable[[ExperimentConfig], torch.nn.Module]
    """The trained network of a config of this task, unloaded (checkpoints for sampling,
    guidance and evaluation load into it)."""
    describe: Callable[[ExperimentConfig], str]
    """The objective as the start-up line names it (``EPSILON, MSE``; ``cross-entropy of x_t``)."""
    usage: Callable[[str], str]
    """How a checkpoint of it is used, given its path: said when a command is given one of this
    task where it wants another."""
    metrics: tuple[Metric, ...]
    """Its training and validation metrics (the loop's own are :data:`LOOP_METRICS`)."""
    train_command: str = "train"
    """The ``raydiff`` command that trains it (a sweep's ``best_config.yaml`` names it)."""
    low_res_input: bool = False
    """Its network takes ``low_res`` (``super_res.small_size``) besides ``x_t``: an upsampler."""
    posthoc_sweep: PosthocSweep = "samples"
    """What ``raydiff ema --evaluate`` measures of each EMA length, and ranks them by:
    ``samples``: samples' FD (ranked by, lower is better), precision and recall in an
    evaluator's features, and the val bits/dim (an upsampler's samples upsample the val images'
    low-resolution versions); ``validation``: the task's own validation of the val split (ranked
    by its first sweep objective, in that metric's direction)."""
    objectives: tuple[str, ...] = field(init=False)
    """The metrics a sweep may optimise; the first is a sweep's default."""

    def __post_init__(self) -> None:
        keys = [m.key for m in self.metrics]
        if len(set(keys)) != len(keys):
            raise ValueError(f"task {self.name!r} declares a metric twice: {keys}")
        objectives = tuple(m.key for m in self.metrics if m.objective is not None)
        if not objectives:
            raise ValueError(f"task {self.name!r} declares no sweep objective")
        object.__setattr__(self, "objectives", objectives)

    def metric(self, key: str) -> Metric:
        """The metric called ``key`` (a KeyError for one the task does not report)."""
        return next(m for m in self.all_metrics() if m.key == key)

    def all_metrics(self) -> tuple[Metric, ...]:
        """The loop's metrics, then the task's."""
        return (*LOOP_METRICS, *self.metrics)

    def headline(self) -> tuple[Metric, ...]:
        """The task's headline metrics, then the loop's (throughput, lr)."""
        return tuple(m for m in (*self.metrics, *LOOP_METRICS) if m.headline)


LOOP_METRICS: tuple[Metric, ...] = (
    Metric(key="step", description="Optimiser steps taken (the run's total)", gauge="step"),
    Metric(key="epoch", description="Training epoch", gauge="epoch"),
    Metric(
        key="grad_norm",
        description="Gradient norm, mean over the steps since the last report",
        gauge="grad_norm",
    ),
    Metric(
        key="images_per_s",
        description="Training throughput, images/s over all workers",
        display="{:.0f} img/s",
        gauge="images_per_second",
        headline=True,
    ),
    Metric(
        key="step_time",
        description="Wall time per step (data wait + optimiser step)",
        gauge="step_time_seconds",
    ),
    Metric(
        key="data_wait_fraction",
        description="Share of the step time spent waiting for data",
        gauge="data_wait_fraction",
    ),
    Metric(
        key="lr",
        description="Learning rate of the last step",
        display="lr {:.2e}",
        gauge="learning_rate",
        headline=True,
    ),
    Metric(
        key="loss_scale",
        description="fp16 gradient scaler's loss scale (1 without fp16)",
        gauge="loss_scale",
    ),
    Metric(
        key="skipped_steps",
        description="Steps skipped for non-finite gradients (run total)",
        gauge="skipped_steps",
    ),
)
"""What the loop reports for every task: progress, throughput, optimiser state."""
