"""Sample grids during training: DDIM samples (of the EMA weights), written as PNG."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from raydiff.core.respace import SpacedDiffusion, space_timesteps


def sampling_diffusion(base: SpacedDiffusion, *, steps: int) -> SpacedDiffusion:
    """A DDIM-spaced copy of the training diffusion for quick preview samples."""
    total = base.original_num_steps
    steps = min(steps, total)
    try:
        use = space_timesteps(total, f"ddim{steps}")
    except ValueError:  # no integer stride gives exactly `steps`: equal sections instead
        use = space_timesteps(total, str(steps))
    kept = sorted(base.use_timesteps)
    if len(kept) != total:  # already respaced: sample on its own steps
        use = set(kept)
    return SpacedDiffusion(
        use_timesteps=use,
        betas=base.original_betas,
        model_mean_type=base.model_mean_type,
        model_var_type=base.model_var_type,
        loss_type=base.loss_type,
        rescale_timesteps=base.rescale_timesteps,
    )


@torch.no_grad()
def draw_samples(
    *,
    model: torch.nn.Module,
    diffusion: SpacedDiffusion,
    num_samples: int,
    image_shape: tuple[int, int, int],
    seed: int,
    num_classes: int | None,
    model_kwargs: dict[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """DDIM samples ``[N, C, H, W]`` of ``model`` as it is (the loop loads the EMA weights
    first); a fixed seed makes grids comparable over a run. Class-conditional models get the
    classes in turn, unless ``model_kwargs`` (tensors on the model's device: an upsampler's
    ``low_res``) gives ``y``."""
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    kwargs = dict(model_kwargs or {})
    if num_classes and "y" not in kwargs:
        kwargs["y"] = (torch.arange(num_samples) % num_classes).to(device)
    return diffusion.ddim_sample_loop(
        model,
        (num_samples, *image_shape),
        model_kwargs=kwargs,
        generator=generator,
        device=device,
    )


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """``[N, C, H, W]`` in [-1, 1] -> ``[N, H, W, C]`` uint8, as improved-diffusion's sampler does."""
    x = ((images.detach().float().cpu() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
    return x.permute(0, 2, 3, 1).numpy()


def tile(pixels: np.ndarray, *, columns: int | None = None, padding: int = 2) -> np.ndarray:
    """Tile uint8 images ``[N, H, W, C]`` into one ``[H', W', C]`` grid (``columns``: default
    about sqrt(N)), with ``padding`` px of black between them."""
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


def save_png(pixels: np.ndarray, path: Path) -> Path:
    """Write one uint8 ``[H, W, C]`` image (C = 1 or 3) as PNG and return its path."""
    mode = "L" if pixels.shape[-1] == 1 else "RGB"
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels[..., 0] if mode == "L" else pixels, mode=mode).save(path)
    return path
