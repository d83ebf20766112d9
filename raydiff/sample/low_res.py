"""The low-resolution images an upsampler is conditioned on (``raydiff sample --low-res``).

As improved-diffusion's ``super_res_sample.py``: ``arr_0`` of a samples npz (uint8
``[N, h, w, C]`` at the upsampler's ``small_size``) and, for a class-conditional upsampler, the
labels in ``arr_1``, which the upsampled samples carry on. Sample ``i`` upsamples image
``i % N`` (the original cycles through the file the same way), so ``--num-samples`` may exceed
N. No Ray here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from raydiff.config import ExperimentConfig
from raydiff.data.image_sources import load_images
from raydiff.errors import UserInputError
from raydiff.sample.outputs import is_npz_name
from raydiff.storage import local_copy, resolve_location


@dataclass(frozen=True)
class LowResImages:
    """uint8 ``[N, h, w, C]`` images and their int64 labels (``arr_1``; None without)."""

    images: np.ndarray
    labels: np.ndarray | None
    source: str

    def labels_of(self, num_samples: int) -> np.ndarray | None:
        """The labels of samples ``0 .. num_samples - 1`` (None without labels)."""
        if self.labels is None:
            return None
        return self.labels[np.arange(num_samples) % len(self.labels)]


def model_input_of(images: np.ndarray, indices: range) -> torch.Tensor:
    """The upsampler's input of samples ``indices``: image ``i % N`` of the uint8 ``[N, h, w,
    C]`` ``images`` for sample ``i``, as float ``[B, C, h, w]`` in [-1, 1] (``x / 127.5 - 1``,
    as ``super_res_sample.py`` converts ``arr_0``)."""
    chosen = images[np.arange(indices.start, indices.stop) % len(images)]
    return torch.from_numpy(chosen.astype(np.float32) / 127.5 - 1).permute(0, 3, 1, 2)


def load_low_res(source: str, *, config: ExperimentConfig) -> LowResImages:
    """The ``--low-res`` images for the upsampler ``config``: a samples ``.npz`` or a
    ``raydiff sample`` folder holding one (a local path or a URI). Images of another size or
    channel count than the upsampler's input are refused, naming both; so is a file without
    labels for a class-conditional upsampler."""
    location = resolve_location(source)
    if not location.exists():
        raise UserInputError(f"--low-res {source} does not exist")
    if location.is_dir():
        npz = sorted(p for p in location.iterdir() if is_npz_name(p.name))
        if len(npz) != 1:
            raise UserInputError(
                f"--low-res {source}: expected a samples_*.npz file, or a folder holding one "
                f"(it holds {len(npz)})"
            )
        location = npz[0]
    with local_copy(location) as local:
        images = load_images(local)
        with np.load(local, allow_pickle=False) as archive:
            labels = archive["arr_1"].astype(np.int64) if "arr_1" in archive.files else None
    _check_fits(images, labels, source=source, config=config)
    return LowResImages(images=images, labels=labels, source=str(location))


def _check_fits(
    images: np.ndarray, labels: np.ndarray | None, *, source: str, config: ExperimentConfig
) -> None:
    small, channels = config.super_res.small_size, config.model.in_channels
    _, height, width, depth = images.shape
    if (height, width, depth) != (small, small, channels):
        raise UserInputError(
            f"--low-res {source} holds {width}x{height}x{depth} images; the upsampler takes "
            f"{small}x{small}x{channels} (super_res.small_size={small}, "
            f"model.in_channels={channels}) and makes {config.model.image_size}x"
            f"{config.model.image_size}"
        )
    if labels is not None and labels.shape != (len(images),):
        raise UserInputError(
            f"--low-res {source}: arr_1 holds {labels.shape} labels for {len(images)} images"
        )
    if config.model.class_cond:
        if labels is None:
            raise UserInputError(
                f"--low-res {source} has no labels (arr_1), and the upsampler is "
                "class-conditional: give the base model's samples with their labels"
            )
        bad = sorted({int(y) for y in labels if not 0 <= y < config.model.num_classes})
        if bad:
            raise UserInputError(
                f"--low-res {source}: labels {bad[:5]} are not classes of the upsampler "
                f"(0..{config.model.num_classes - 1})"
            )


def check_cascade(
    base: ExperimentConfig,
    upsampler: ExperimentConfig,
    *,
    base_classes: int | None,
    name: str,
) -> None:
    """A cascade's base model makes images the upsampler ``name`` takes (size and channels),
    and labels for a class-conditional upsampler (``base_classes``: the number of classes the
    base samples get labels of, None for none)."""
    small, channels = upsampler.super_res.small_size, upsampler.model.in_channels
    size, depth = base.model.image_size, base.model.in_channels
    if (size, depth) != (small, channels):
        raise UserInputError(
            f"--upsampler {name} takes {small}x{small}x{channels} images "
            f"(super_res.small_size={small}); the base model makes {size}x{size}x{depth}"
        )
    if not upsampler.model.class_cond:
        return
    if base_classes is None:
        raise UserInputError(
            f"--upsampler {name} is class-conditional: the base model's samples need labels "
            "(a class-conditional base model, or --classifier guidance)"
        )
    if base_classes > upsampler.model.num_classes:
        raise UserInputError(
            f"--upsampler {name} has {upsampler.model.num_classes} classes; the base samples' "
            f"labels range over {base_classes}"
        )
