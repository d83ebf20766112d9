"""The diffusion model as a task of the loop: IDDPM's training losses, validation bits/dim of
the bound, DDIM preview grids.

What the model is conditioned on (class labels; an upsampler's low-resolution input) and what
its preview shows are parts the task is built from, so the upsampler
(:mod:`raydiff.train.tasks.super_res`) is this task with other parts, not a copy of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from raydiff.config import ExperimentConfig
from raydiff.core.gaussian_diffusion import GaussianDiffusion
from raydiff.core.respace import SpacedDiffusion
from raydiff.factory import create_gaussian_diffusion, create_model
from raydiff.seeding import derive_seed
from raydiff.train.runtime import Batch, Runtime, ValBatches
from raydiff.train.sample_grid import draw_samples, sampling_diffusion
from raydiff.train.task import Metric, TaskSpec
from raydiff.train.validation import (
    BoundTimesteps,
    estimate_bpd,
    stratified_timesteps,
    validation_metrics,
)

Conditioning = Callable[[torch.Tensor, dict[str, torch.Tensor]], dict[str, torch.Tensor]]
"""``(x, batch) -> model_kwargs``: what the model is given besides ``x_t`` and ``t``, built from
the images and the rest of their batch (labels ``y``)."""


def class_labels(x: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The labels ``y`` where the batch has them (a class-conditional model), else nothing."""
    return {"y": batch["y"]} if "y" in batch else {}


class Preview(Protocol):
    """What a diffusion task's preview grid shows, drawn with the evaluation weights."""

    columns: int | None
    """Columns of the grid (None: about the square root of the image count)."""

    def draw(self, model: torch.nn.Module, *, seed: int) -> torch.Tensor | None:
        """Images ``[N, C, H, W]`` in [-1, 1], or None when there is nothing to show."""
        ...


@dataclass(frozen=True, kw_only=True, eq=False)
class SamplePreview:
    """DDIM samples from noise; a class-conditional model's get the classes in turn."""

    diffusion: SpacedDiffusion
    count: int
    image_shape: tuple[int, int, int]
    num_classes: int | None
    columns: int | None = None

    def draw(self, model: torch.nn.Module, *, seed: int) -> torch.Tensor:
        return draw_samples(
            model=model,
            diffusion=self.diffusion,
            num_samples=self.count,
            image_shape=self.image_shape,
            seed=seed,
            num_classes=self.num_classes,
        )


class DiffusionTask:
    """A UNet that predicts the noise (and the variance with ``learn_sigma``) of ``x_t``.

    :param eval_timesteps: the timesteps of the validation estimate of the bound.
    :param conditioning: the model's keyword arguments from a batch (:data:`Conditioning`).
    :param preview: what the preview grid shows (:class:`Preview`; None: no preview).
    """

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        diffusion: SpacedDiffusion,
        eval_timesteps: BoundTimesteps,
        conditioning: Conditioning = class_labels,
        preview: Preview | None = None,
    ) -> None:
        self.model = model
        self.diffusion: GaussianDiffusion = diffusion
        self.eval_timesteps = eval_timesteps
        self.conditioning = conditioning
        self.previewer = preview
        self.preview_columns = preview.columns if preview is not None else None

    def losses(
        self, model: torch.nn.Module, batch: Batch, t: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """``training_losses`` of ``batch["x"]`` given the batch's conditioning."""
        return self.diffusion.training_losses(
            model,
            batch["x"],
            t,
            model_kwargs=self.conditioning(batch["x"], batch),
            noise=batch.get("noise"),
        )

    def evaluate(
        self, model: torch.nn.Module, batches: ValBatches, *, seed: int
    ) -> dict[str, torch.Tensor]:
        """Totals of the bound estimate (``raydiff.train.validation.estimate_bpd``), each image
        given its conditioning."""
        return estimate_bpd(
            diffusion=self.diffusion,
            model=model,
            batches=[(x, self.conditioning(x, cond)) for x, cond in batches],
            timesteps=self.eval_timesteps,
            seed=seed,
        )

    def evaluation_metrics(self, totals: dict[str, torch.Tensor]) -> dict[str, float]:
        """``val_bpd`` and ``val_mse``."""
        return validation_metrics(totals)

    def preview(self, model: torch.nn.Module, *, seed: int) -> torch.Tensor | None:
        return self.previewer.draw(model, seed=seed) if self.previewer is not None else None


def diffusion_parts(config: ExperimentConfig, *, super_res: bool = False) -> dict[str, Any]:
    """What every diffusion task of ``config`` shares: its model (a ``SuperResModel`` with
    ``super_res``), diffusion and validation timesteps."""
    diffusion = create_gaussian_diffusion(config.diffusion)
    return {
        "model": create_model(
            config.model, learn_sigma=config.diffusion.learn_sigma, super_res=super_res
        ),
        "diffusion": diffusion,
        "eval_timesteps": stratified_timesteps(
            diffusion.num_timesteps,
            config.train.eval_timesteps,
            seed=derive_seed(config.train.seed, "val-timesteps"),
        ),
    }


def image_shape(config: ExperimentConfig) -> tuple[int, int, int]:
    """``(C, H, W)`` of the model's images."""
    model = config.model
    return (model.in_channels, model.image_size, model.image_size)


def diffusion_task(config: ExperimentConfig, *, runtime: Runtime) -> DiffusionTask:
    """The loop's default :class:`raydiff.train.task.TaskFactory`: the diffusion model of
    ``config`` (it needs nothing from ``runtime`` to build)."""
    parts = diffusion_parts(config)
    preview = SamplePreview(
        diffusion=sampling_diffusion(parts["diffusion"], steps=config.train.sample_steps),
        count=config.train.sample_count,
        image_shape=image_shape(config),
        num_classes=config.model.num_classes if config.model.class_cond else None,
    )
    return DiffusionTask(**parts, preview=preview)


def describe_objective(config: ExperimentConfig) -> str:
    """The parameterisation and loss, as the start-up line names them (``EPSILON, MSE``)."""
    diffusion = create_gaussian_diffusion(config.diffusion)
    return f"{diffusion.model_mean_type.name}, {diffusion.loss_type.name}"


DIFFUSION_METRICS: tuple[Metric, ...] = (
    Metric(
        key="val_bpd",
        description="Validation bits/dim of the EMA weights",
        display="val_bpd {:.3f}",
        gauge="val_bpd",
        objective="min",
        headline=True,
    ),
    Metric(
        key="val_mse",
        description="Validation MSE of the EMA weights",
        gauge="val_mse",
        objective="min",
        headline=True,
    ),
    Metric(
        key="loss",
        description="Training loss, importance-weighted mean over all workers since the last report",
        display="loss {:.4f}",
        gauge="loss",
        objective="min",
        headline=True,
    ),
    Metric(
        key="mse",
        description="Epsilon (or x0) MSE term of the training loss",
        display="mse {:.4f}",
        gauge="mse",
        objective="min",
        headline=True,
    ),
    Metric(
        key="vb",
        description="Variational-bound term of the training loss (learned sigma)",
        gauge="vb",
        objective="min",
    ),
)
"""A diffusion model's figures (an upsampler's too, each given its input)."""

SPEC = TaskSpec(
    name="diffusion",
    build=diffusion_task,
    network=lambda config: create_model(config.model, learn_sigma=config.diffusion.learn_sigma),
    describe=describe_objective,
    usage=lambda checkpoint: f"a diffusion model samples: raydiff sample --checkpoint {checkpoint}",
    metrics=DIFFUSION_METRICS,
)
