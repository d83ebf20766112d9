"""The tiny UNet of the tests that train or evaluate a model, as ``--set`` overrides.

A 16x16x1 (or 8x8x1) UNet of 32 channels, two levels of one residual block each: a few thousand
parameters, milliseconds per step on a CPU. Tests add what they check (attention, diffusion
steps, batch, intervals, workers) after these. Importable from every test module: pytest puts
``tests/`` on ``sys.path`` for ``tests/conftest.py``.
"""

from __future__ import annotations


def tiny_model(*, image_size: int = 16, attention: str = "") -> list[str]:
    """Overrides for the tiny UNet: ``attention`` is ``model.attention_resolutions`` ("" none,
    "8": self-attention at 8x8)."""
    return [
        f"model.image_size={image_size}",
        "model.in_channels=1",
        "model.num_channels=32",
        "model.channel_mult=1,2",
        "model.num_res_blocks=1",
        f"model.attention_resolutions={attention}",
    ]
