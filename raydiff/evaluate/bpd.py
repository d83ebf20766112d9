"""The full variational bound in bits/dim, image by image, independent of who computes it.

IDDPM eq. 5: ``L_vlb = L_0 + ... + L_{T-1} + L_T``; ``GaussianDiffusion.calc_bpd_loop`` walks all
T steps and returns every term per image. Image ``i`` draws the noise of every ``q(x_t | x_0)``
from its own stream, keyed ``derive_seed(seed, "bpd", i)`` (:mod:`raydiff.core.keyed_noise`), so its terms are the same whatever
batch or worker it lands in, and the terms of a split are the concatenation of any partition of
it. The total is the mean over images of ``prior + sum_t vb_t`` (improved-diffusion's
``image_nll.py`` reports the same mean). No Ray here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raydiff.core.gaussian_diffusion import GaussianDiffusion
from raydiff.core.keyed_noise import RowNoise
from raydiff.seeding import derive_seed


def bpd_noise(seed: int, indices: Sequence[int], *, device: torch.device | str) -> RowNoise:
    """The noise of every image at ``indices``: a stream each, keyed from (seed, index) alone."""
    return RowNoise.for_rows(derive_seed(seed, "bpd", bits=64), list(indices), device=device)


@torch.no_grad()
def image_bpd_terms(
    model: torch.nn.Module,
    diffusion: GaussianDiffusion,
    *,
    images: torch.Tensor,
    indices: Sequence[int],
    seed: int,
    labels: torch.Tensor | None = None,
    clip_denoised: bool = True,
    low_res_size: int | None = None,
) -> dict[str, np.ndarray]:
    """Every term of the bound for ``images`` (float ``[N, C, H, W]`` in [-1, 1], the dataset's
    images ``indices``), as float64 numpy arrays: ``total_bpd``/``prior_bpd`` ``[N]``,
    ``vb``/``xstart_mse``/``mse`` ``[N, T]``. ``low_res_size``: an upsampler's bound, each image
    given itself shrunk to that size (as its training made its input)."""
    if len(indices) != images.shape[0]:
        raise ValueError(f"{len(indices)} indices for {images.shape[0]} images")
    device = next(model.parameters()).device
    kwargs = {"y": labels.to(device)} if labels is not None else {}
    if low_res_size is not None:
        from raydiff.train.tasks.super_res import low_res_of

        kwargs["low_res"] = low_res_of(images, low_res_size).to(device)
    terms = diffusion.calc_bpd_loop(
        model,
        images.to(device),
        clip_denoised=clip_denoised,
        model_kwargs=kwargs,
        generator=bpd_noise(seed, indices, device=device),
    )
    return {k: v.detach().double().cpu().numpy() for k, v in terms.items()}


def concatenate_terms(parts: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The terms of several batches, in the order given."""
    if not parts:
        raise ValueError("no batches to concatenate")
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def summarize_terms(terms: Mapping[str, np.ndarray], *, num_timesteps: int) -> dict[str, Any]:
    """The figures to print: the mean bound in bits/dim, its standard error over images, and its
    split into the prior ``L_T``, the decoder ``L_0`` and the middle terms ``L_1..L_{T-1}``."""
    total = terms["total_bpd"]
    vb = terms["vb"]
    n = len(total)
    return {
        "bpd": float(total.mean()),
        "bpd_stderr": float(total.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan"),
        "prior_bpd": float(terms["prior_bpd"].mean()),
        # Column T-1 of the walk is t = 0: L_0, the discretised decoder NLL.
        "decoder_bpd": float(vb[:, -1].mean()),
        "middle_bpd": float(vb[:, :-1].sum(axis=1).mean()),
        "mse": float(terms["mse"].mean()),
        "num_images": n,
        "num_timesteps": num_timesteps,
    }


def write_terms(
    path: Path,
    terms: Mapping[str, np.ndarray],
    *,
    timesteps: Sequence[int],
    indices: Sequence[int],
) -> Path:
    """All terms per image as an npz (atomically): ``total_bpd``, ``prior_bpd`` ``[N]``;
    ``vb``, ``xstart_mse``, ``mse`` ``[N, T]`` whose column j is timestep ``timesteps[j]``;
    ``indices``: the dataset rows the images are. Stored as float32 (the means are printed from
    the float64 values)."""
    arrays: dict[str, np.ndarray] = {k: np.asarray(v, dtype=np.float32) for k, v in terms.items()}
    arrays["timesteps"] = np.asarray(timesteps, dtype=np.int64)
    arrays["indices"] = np.asarray(indices, dtype=np.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)
    return path


def walk_timesteps(diffusion: GaussianDiffusion) -> list[int]:
    """The original timestep of each column of the walk (T-1 first; a respaced diffusion's
    columns are its kept steps)."""
    original = getattr(diffusion, "timestep_map", None)
    steps = range(diffusion.num_timesteps - 1, -1, -1)
    return [int(original[s]) for s in steps] if original is not None else list(steps)
