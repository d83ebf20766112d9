"""Image grids of samples, written as PNG (what users look at during training)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """``[N, C, H, W]`` in [-1, 1] -> ``[N, H, W, C]`` uint8, as improved-diffusion's sampler does."""
    x = ((images.detach().float().cpu() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
    return x.permute(0, 2, 3, 1).numpy()


def make_grid(images: torch.Tensor, *, columns: int | None = None, padding: int = 2) -> np.ndarray:
    """Tile a batch into one ``[H', W', C]`` uint8 image with ``padding`` px of black between."""
    pixels = to_uint8(images)
    n, h, w, c = pixels.shape
    columns = columns or math.ceil(math.sqrt(n))
    rows = math.ceil(n / columns)
    grid = np.zeros(
        (rows * (h + padding) + padding, columns * (w + padding) + padding, c), np.uint8
    )
    for i in range(n):
        r, col = divmod(i, columns)
        y, x = padding + r * (h + padding), padding + col * (w + padding)
        grid[y : y + h, x : x + w] = pixels[i]
    return grid


def save_grid(images: torch.Tensor, path: Path, *, columns: int | None = None) -> Path:
    """Write a PNG grid of ``images`` and return its path."""
    grid = make_grid(images, columns=columns)
    mode = "L" if grid.shape[-1] == 1 else "RGB"
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid[..., 0] if mode == "L" else grid, mode=mode).save(path)
    return path
