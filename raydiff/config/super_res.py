"""The super_res section: an upsampler's low-resolution input (``train.task=super_res``)."""

from __future__ import annotations

from dataclasses import dataclass

from raydiff.config.field_values import invalid


@dataclass(kw_only=True, frozen=True)
class SuperResConfig:
    """improved-diffusion's super-resolution model (``super_res_train.py``): the model section's
    UNet at ``model.image_size`` (its ``--large_size``), conditioned on the image shrunk to
    ``small_size`` (``F.interpolate(mode="area")`` of the batch), when ``train.task`` is
    'super_res'."""

    small_size: int = 64
    """Side of the low-resolution input in pixels (improved-diffusion's ``--small_size``)."""

    def __post_init__(self) -> None:
        if self.small_size < 1:
            raise invalid("super_res", "small_size", self.small_size, "must be >= 1")
