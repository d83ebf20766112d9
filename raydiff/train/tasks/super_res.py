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
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from raydiff.config import ExperimentConfig
from raydiff.core.respace import SpacedDiffusion
from raydiff.factory import create_model
from raydiff.train.runtime import Runtime
from raydiff.train.sample_grid import draw_samples, sampling_diffusion
from raydiff.train.task import TaskSpec
from raydiff.train.tasks.diffusion import (
    DIFFUSION_METRICS,
    DiffusionTask,
    class_labels,
    describe_objective,
    diffusion_parts,
    image_shape,
)


def low_res_of(images: torch.Tensor, small_size: int) -> torch.Tensor:
    """``[B, C, S, S]`` -> ``[B, C, small_size, small_size]``: improved-diffusion's
    ``load_superres_data`` (area interpolation: the mean of each cell of the large image)."""
    return F.interpolate(images, small_size, mode="area")


class LowResConditioning:
    """The upsampler's model kwargs: ``low_res`` of the images (and the labels ``y`` of a
    class-conditional upsampler)."""

    def __init__(self, small_size: int) -> None:
        self.small_size = small_size

    def __call__(self, x: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {**class_labels(x, batch), "low_res": low_res_of(x, self.small_size)}


@dataclass(frozen=True, kw_only=True, eq=False)
class UpsamplingPreview:
    """Pairs ``[2N, C, H, W]``: each low-resolution input (enlarged, nearest) and its DDIM
    upsampling, side by side in the grid's rows.

    :param inputs: the model kwargs of the inputs: ``low_res`` ``[N, C, small_size,
        small_size]`` of the first validation images (and their labels ``y`` for a
        class-conditional upsampler), or None for no preview.
    """

    diffusion: SpacedDiffusion
    image_shape: tuple[int, int, int]
    inputs: dict[str, torch.Tensor] | None

    @property
    def columns(self) -> int | None:
        """Each input and its upsampling side by side in a row."""
        return 2 * math.ceil(math.sqrt(len(self.inputs["low_res"]))) if self.inputs else None

    def draw(self, model: torch.nn.Module, *, seed: int) -> torch.Tensor | None:
        if self.inputs is None:
            return None
        device = next(model.parameters()).device
        inputs = {k: v.to(device) for k, v in self.inputs.items()}
        outputs = draw_samples(
            model=model,
            diffusion=self.diffusion,
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


def super_res_task(config: ExperimentConfig, *, runtime: Runtime) -> DiffusionTask:
    """The :class:`raydiff.train.task.TaskFactory` of ``train.task=super_res``: the diffusion
    task with a ``SuperResModel``, its low-resolution conditioning, and a preview of the first
    ``train.sample_count`` validation images upsampled (none without a val split)."""
    small_size = config.super_res.small_size
    parts = diffusion_parts(config, super_res=True)
    preview = UpsamplingPreview(
        diffusion=sampling_diffusion(parts["diffusion"], steps=config.train.sample_steps),
        image_shape=image_shape(config),
        inputs=preview_inputs(runtime, count=config.train.sample_count, small_size=small_size),
    )
    return DiffusionTask(**parts, conditioning=LowResConditioning(small_size), preview=preview)


def describe_upsampler(config: ExperimentConfig) -> str:
    """The objective and the input, as the start-up line names them."""
    size = config.model.image_size
    small = config.super_res.small_size
    return f"{describe_objective(config)} given {small}x{small} inputs upsampled to {size}x{size}"


SPEC = TaskSpec(
    name="super_res",
    build=super_res_task,
    network=lambda config: create_model(
        config.model, learn_sigma=config.diffusion.learn_sigma, super_res=True
    ),
    describe=describe_upsampler,
    usage=lambda checkpoint: (
        "an upsampler samples from low-resolution images: raydiff sample --checkpoint "
        f"{checkpoint} --low-res SAMPLES.npz"
    ),
    metrics=DIFFUSION_METRICS,  # its bound and loss, each image given its input
    low_res_input=True,  # a post-hoc EMA sweep upsamples the val images' low-res versions
)
