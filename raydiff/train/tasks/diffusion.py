"""The diffusion model as a task of the loop: IDDPM's training losses, validation bits/dim of
the bound, DDIM preview grids."""

from __future__ import annotations

from typing import Any

import torch

from raydiff.config import ExperimentConfig
from raydiff.core.gaussian_diffusion import GaussianDiffusion
from raydiff.core.respace import SpacedDiffusion
from raydiff.factory import create_gaussian_diffusion, create_model
from raydiff.seeding import derive_seed
from raydiff.train.runtime import Runtime
from raydiff.train.sample_grid import draw_samples, sampling_diffusion
from raydiff.train.task import Batch, ValBatches
from raydiff.train.validation import (
    BoundTimesteps,
    estimate_bpd,
    stratified_timesteps,
    validation_metrics,
)


class DiffusionTask:
    """A UNet that predicts the noise (and the variance with ``learn_sigma``) of ``x_t``.

    :param eval_timesteps: the timesteps of the validation estimate of the bound.
    :param sample_count: images per preview grid; ``sample_steps``: its DDIM steps.
    :param num_classes: the class count of a class-conditional model (labels from ``y``).
    """

    preview_columns: int | None = None

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        diffusion: SpacedDiffusion,
        eval_timesteps: BoundTimesteps,
        image_shape: tuple[int, int, int],
        sample_count: int,
        sample_steps: int,
        num_classes: int | None = None,
    ) -> None:
        self.model = model
        self.diffusion: GaussianDiffusion = diffusion
        self.eval_timesteps = eval_timesteps
        self.image_shape = image_shape
        self.sample_count = sample_count
        self.preview_diffusion = sampling_diffusion(diffusion, steps=sample_steps)
        self.num_classes = num_classes

    @classmethod
    def from_config(cls, config: ExperimentConfig) -> DiffusionTask:
        """The model of ``config.model``, the diffusion of ``config.diffusion``."""
        return cls(**task_arguments(config))

    def losses(
        self, model: torch.nn.Module, batch: Batch, t: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """``training_losses`` of ``batch["x"]``; labels reach the model as ``y``."""
        kwargs = {"y": batch["y"]} if "y" in batch else {}
        return self.diffusion.training_losses(
            model, batch["x"], t, model_kwargs=kwargs, noise=batch.get("noise")
        )

    def evaluate(
        self, model: torch.nn.Module, batches: ValBatches, *, seed: int
    ) -> dict[str, torch.Tensor]:
        """Totals of the bound estimate (``raydiff.train.validation.estimate_bpd``)."""
        return estimate_bpd(
            diffusion=self.diffusion,
            model=model,
            batches=batches,
            timesteps=self.eval_timesteps,
            seed=seed,
        )

    def evaluation_metrics(self, totals: dict[str, torch.Tensor]) -> dict[str, float]:
        """``val_bpd`` and ``val_mse``."""
        return validation_metrics(totals)

    def preview(self, model: torch.nn.Module, *, seed: int) -> torch.Tensor:
        """DDIM samples (class-conditional models get the classes in turn)."""
        return draw_samples(
            model=model,
            diffusion=self.preview_diffusion,
            num_samples=self.sample_count,
            image_shape=self.image_shape,
            seed=seed,
            num_classes=self.num_classes,
        )


def diffusion_task(config: ExperimentConfig, *, runtime: Runtime) -> DiffusionTask:
    """The loop's default :class:`raydiff.train.task.TaskFactory`: the diffusion model of
    ``config`` (it needs nothing from ``runtime`` to build)."""
    return DiffusionTask.from_config(config)


def task_arguments(config: ExperimentConfig, *, super_res: bool = False) -> dict[str, Any]:
    """:class:`DiffusionTask`'s arguments from ``config``: its model (a ``SuperResModel`` with
    ``super_res``), diffusion, validation timesteps, preview settings and classes."""
    train, model = config.train, config.model
    diffusion = create_gaussian_diffusion(config.diffusion)
    return {
        "model": create_model(model, learn_sigma=config.diffusion.learn_sigma, super_res=super_res),
        "diffusion": diffusion,
        "eval_timesteps": stratified_timesteps(
            diffusion.num_timesteps,
            train.eval_timesteps,
            seed=derive_seed(train.seed, "val-timesteps"),
        ),
        "image_shape": (model.in_channels, model.image_size, model.image_size),
        "sample_count": train.sample_count,
        "sample_steps": train.sample_steps,
        "num_classes": model.num_classes if model.class_cond else None,
    }
