"""improved-diffusion's super-resolution model as a task of the loop (its ``super_res_train.py``).

The model section's UNet at ``model.image_size`` (the original's ``--large_size``) becomes a
``SuperResModel``: it denoises the large image conditioned on that image shrunk to
``super_res.small_size``, which it upsamples bilinearly and concatenates to ``x_t``. The
low-resolution input is made from each batch as the original's ``load_superres_data`` makes it,
``F.interpolate(large_batch, small_size, mode="area")`` of the images in [-1, 1] (after the
flip, as guided-diffusion's loader flips before it). Training loss, validation bits/dim and the
loss-aware sampler are the diffusion model's, with ``low_res`` in the model's keyword arguments.
The preview upsamples the first validation images' low-resolution versions and shows each
input (nearest-neighbour enlarged) beside its output.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from raydiff.config import ExperimentConfig
from raydiff.train.runtime import Runtime
from raydiff.train.sample_grid import draw_samples
from raydiff.train.task import Batch, ValBatches
from raydiff.train.tasks.diffusion import DiffusionTask, task_arguments
from raydiff.train.validation import estimate_bpd


def low_res_of(images: torch.Tensor, small_size: int) -> torch.Tensor:
    """``[B, C, S, S]`` -> ``[B, C, small_size, small_size]``: improved-diffusion's
    ``load_superres_data`` (area interpolation: the mean of each cell of the large image)."""
    return F.interpolate(images, small_size, mode="area")


class SuperResTask(DiffusionTask):
    """A ``SuperResModel`` trained as the diffusion model is, on ``low_res`` of each batch.

    :param small_size: the side of the low-resolution input.
    :param preview_inputs: the preview's model kwargs: ``low_res`` ``[N, C, small_size,
        small_size]`` of the first validation images (and their labels ``y`` for a
        class-conditional upsampler), or None for no preview.
    """

    def __init__(
        self,
        *,
        small_size: int,
        preview_inputs: dict[str, torch.Tensor] | None,
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.small_size = small_size
        self.preview_inputs = preview_inputs
        if preview_inputs is not None:  # each input and its upsampling side by side in a row
            self.preview_columns = 2 * math.ceil(math.sqrt(len(preview_inputs["low_res"])))

    def losses(
        self, model: torch.nn.Module, batch: Batch, t: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """``training_losses`` of ``batch["x"]`` with ``low_res`` (and ``y``) as model kwargs."""
        kwargs = {"low_res": low_res_of(batch["x"], self.small_size)}
        if "y" in batch:
            kwargs["y"] = batch["y"]
        return self.diffusion.training_losses(
            model, batch["x"], t, model_kwargs=kwargs, noise=batch.get("noise")
        )

    def evaluate(
        self, model: torch.nn.Module, batches: ValBatches, *, seed: int
    ) -> dict[str, torch.Tensor]:
        """The bound estimate of the upsampler: each image's bits/dim given its low-resolution
        version."""
        conditioned = [
            (x, {**cond, "low_res": low_res_of(x, self.small_size)}) for x, cond in batches
        ]
        return estimate_bpd(
            diffusion=self.diffusion,
            model=model,
            batches=conditioned,
            timesteps=self.eval_timesteps,
            seed=seed,
        )

    def preview(self, model: torch.nn.Module, *, seed: int) -> torch.Tensor | None:
        """Pairs ``[2N, C, H, W]``: each low-resolution input (enlarged, nearest) and its DDIM
        upsampling, side by side in the grid's rows."""
        if self.preview_inputs is None:
            return None
        device = next(model.parameters()).device
        inputs = {k: v.to(device) for k, v in self.preview_inputs.items()}
        outputs = draw_samples(
            model=model,
            diffusion=self.preview_diffusion,
            num_samples=len(inputs["low_res"]),
            image_shape=self.image_shape,
            seed=seed,
            num_classes=None,
            model_kwargs=inputs,
        )
        enlarged = F.interpolate(inputs["low_res"], self.image_shape[1:], mode="nearest")
        return torch.stack([enlarged, outputs], dim=1).flatten(0, 1)


def preview_inputs(
    runtime: Runtime, *, count: int, small_size: int
) -> dict[str, torch.Tensor] | None:
    """``low_res`` (and ``y`` where the runtime gives labels) of the first ``count`` validation
    images, on the CPU; None without a val split."""
    batches = runtime.val_batches(rows=range(count), batch_size=count)
    images = torch.cat([x for x, _ in batches]).cpu() if batches else None
    if images is None or len(images) == 0:
        return None
    inputs = {"low_res": low_res_of(images, small_size)}
    if all("y" in cond for _, cond in batches):
        inputs["y"] = torch.cat([cond["y"] for _, cond in batches]).cpu()
    return inputs


def super_res_task(config: ExperimentConfig, *, runtime: Runtime) -> SuperResTask:
    """The :class:`raydiff.train.task.TaskFactory` of ``train.task=super_res``: the preview's
    inputs are the first ``train.sample_count`` validation images (none without a val split)."""
    small_size = config.super_res.small_size
    count = config.train.sample_count
    return SuperResTask(
        small_size=small_size,
        preview_inputs=preview_inputs(runtime, count=count, small_size=small_size),
        **task_arguments(config, super_res=True),
    )
