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
from typing import TYPE_CHECKING, Any, Protocol

import torch

from raydiff.core.gaussian_diffusion import GaussianDiffusion

if TYPE_CHECKING:
    from raydiff.config import ExperimentConfig
    from raydiff.train.runtime import Runtime

Batch = dict[str, Any]
"""``x`` float32 [B, C, H, W] in [-1, 1], ``index`` int64 [B], ``y`` int64 [B] when labelled;
in :data:`Losses`, also ``noise`` (like ``x``): the step's standard normal draw for these rows
(``raydiff.train.trainer.Trainer``), the noise of ``q_sample``, and ``augment_seed`` (int64 [B],
on the CPU): a seed per row for a task's random augmentations, keyed by the row's place in the
global batch, so that they do not depend on the number of workers or microbatches."""

ValBatches = list[tuple[torch.Tensor, dict[str, torch.Tensor]]]
"""Validation images on the device, with their labels (``y``) when the runtime was asked for
them."""

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
