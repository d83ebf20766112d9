"""Validation: an unbiased estimate of the NLL bound (bits/dim) from a fixed set of timesteps.

The full bound of IDDPM eq. 5, ``L_prior + sum_t L_t`` (``calc_bpd_loop``), costs T model calls
per image. K timesteps estimate it without bias, ``L_prior + sum_k w_k L_{t_k}`` with ``t_k``
drawn uniformly in stratum k of width ``w_k``, drawn once from a fixed seed so that every
evaluation of a run uses the same ones. Equal strata would make a single draw useless: the bound
sits in a few terms (IDDPM Fig. 2: the first steps; with eps-prediction and a fixed variance the
step from x_T divides the eps error by sqrt(alpha_{T-1}), and the cosine schedule clips
beta_{T-1} to 0.999). So ``t = T-1`` is evaluated on its own (weight 1) and ``[0, T-1)`` is cut
into strata whose edges grow geometrically (``0, 1, 2, 5, 13, 31, ...`` for T = 1000, K = 10).
Its spread on the demo's weights: docs/performance.md,
"Spread of the validation estimate (`bench/val_bpd_spread.py`)".
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import torch

from raydiff.core.gaussian_diffusion import GaussianDiffusion
from raydiff.core.losses import mean_flat


@contextlib.contextmanager
def weights_swapped(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> Iterator[None]:
    """Run the block with ``state`` (e.g. EMA weights) loaded into ``model`` in eval mode.

    The training weights and mode come back afterwards, whatever the block raised.
    """
    current = {k: v.detach().clone() for k, v in model.state_dict().items()}
    was_training = model.training
    model.load_state_dict(state)
    model.eval()
    try:
        yield
    finally:
        model.load_state_dict(current)
        model.train(was_training)


@dataclasses.dataclass(frozen=True)
class BoundTimesteps:
    """Timesteps for the bound estimate and their weights (stratum widths; they sum to T)."""

    timesteps: torch.Tensor  # [K'] int64, distinct
    weights: torch.Tensor  # [K'] float64


def stratified_timesteps(num_timesteps: int, count: int, *, seed: int) -> BoundTimesteps:
    """At most ``count`` timesteps for an unbiased estimate of ``sum_t L_t`` (module docstring).

    ``t = T-1`` on its own, one t drawn uniformly in each geometric stratum of ``[0, T-1)``;
    with ``count >= T`` every timestep, weight 1. Strata that coincide after rounding are merged,
    so fewer than ``count`` timesteps may come back.
    """
    if not 1 <= count <= num_timesteps:
        raise ValueError(
            f"eval timesteps must lie in [1, {num_timesteps}] (the diffusion's steps), got {count}"
        )
    if count == num_timesteps:
        every = torch.arange(num_timesteps)
        return BoundTimesteps(every, torch.ones(num_timesteps, dtype=torch.float64))
    if count == 1:  # one stratum: all of [0, T)
        edges = np.array([0, num_timesteps])
    else:
        last = num_timesteps - 1
        inner = [last] if count == 2 else np.floor(np.geomspace(1, last, count - 1)).astype(int)
        edges = np.unique(np.concatenate([[0], inner]))
    g = torch.Generator().manual_seed(seed)
    low = torch.as_tensor(edges[:-1], dtype=torch.float64)
    width = torch.as_tensor(np.diff(edges), dtype=torch.float64)
    u = torch.rand(len(low), generator=g, dtype=torch.float64)
    timesteps = (low + torch.floor(u * width)).long()
    weights = width
    if edges[-1] < num_timesteps:  # t = T-1 evaluated exactly
        timesteps = torch.cat([timesteps, torch.tensor([num_timesteps - 1])])
        weights = torch.cat([weights, torch.ones(1, dtype=torch.float64)])
    return BoundTimesteps(timesteps, weights)


@torch.no_grad()
def bound_terms(
    *,
    diffusion: GaussianDiffusion,
    model: Callable[..., torch.Tensor],
    x_start: torch.Tensor,
    timesteps: BoundTimesteps,
    model_kwargs: dict[str, torch.Tensor] | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, torch.Tensor]:
    """Per-image sums for the estimate over ``timesteps``: ``vb_sum``, ``mse_sum``, ``prior``.

    ``vb_sum`` is sum_k w_k L_{t_k} in bits/dim, ``mse_sum`` the (unweighted) sum of the eps-MSEs
    at the t_k, ``prior`` the prior term; all of shape [N].
    """
    vb_sum = torch.zeros(x_start.shape[0], device=x_start.device)
    mse_sum = torch.zeros_like(vb_sum)
    weight_of = dict(zip(timesteps.timesteps.tolist(), timesteps.weights.tolist(), strict=True))
    # Walk t downwards like calc_bpd_loop, so with K = T and the same generator both draw the
    # same noise and give the same number.
    for step in sorted(weight_of, reverse=True):
        t = torch.full((x_start.shape[0],), step, device=x_start.device, dtype=torch.long)
        noise = torch.randn(
            x_start.shape, generator=generator, device=generator.device if generator else None
        ).to(x_start)
        x_t = diffusion.q_sample(x_start, t, noise=noise)
        out = diffusion._vb_terms_bpd(
            model, x_start=x_start, x_t=x_t, t=t, clip_denoised=False, model_kwargs=model_kwargs
        )
        vb_sum += weight_of[step] * out["output"].float()
        eps = diffusion._predict_eps_from_xstart(x_t, t, out["pred_xstart"])
        mse_sum += mean_flat((eps - noise) ** 2).float()
    return {"vb_sum": vb_sum, "mse_sum": mse_sum, "prior": diffusion._prior_bpd(x_start).float()}


def rank_rows(num_images: int, *, rank: int, world_size: int) -> range:
    """The rows of ``num_images`` validation rows that ``rank`` of ``world_size`` evaluates: one
    contiguous part each, the parts' sizes differing by at most one, so every row is evaluated
    once whether or not the count divides (150 rows over 2 ranks: 75 each; 3 rows over 4 ranks:
    none on rank 0, one on each other rank)."""
    if num_images < 0 or not 0 <= rank < world_size:
        raise ValueError(
            f"rank_rows of {num_images} images for rank {rank} of {world_size}: the count must "
            "be >= 0 and the rank in [0, world_size)"
        )
    return range(rank * num_images // world_size, (rank + 1) * num_images // world_size)


def rank_slice(
    batches: Iterable[dict[str, torch.Tensor]], *, rows: range
) -> Iterator[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """Rows ``rows`` (a step-1 range, e.g. :func:`rank_rows`) of ``batches`` (dicts with ``x``
    and, class-conditional, ``y``) as ``(x, cond)``: every rank reads the same rows in the same
    order and keeps its own slice, so the images evaluated are the same for any worker count.
    Every batch is consumed (a reader stopped early would leave its pipeline running)."""
    start, stop = rows.start, rows.stop
    seen = 0
    for batch in batches:
        size = batch["x"].shape[0]
        lo, hi = max(start - seen, 0), min(stop - seen, size)
        seen += size
        if lo < hi:
            yield batch["x"][lo:hi], ({"y": batch["y"][lo:hi]} if "y" in batch else {})


def estimate_bpd(
    *,
    diffusion: GaussianDiffusion,
    model: Callable[..., torch.Tensor],
    batches: Iterable[tuple[torch.Tensor, dict[str, torch.Tensor]]],
    timesteps: BoundTimesteps,
    seed: int,
) -> dict[str, torch.Tensor]:
    """Totals over ``batches``: ``count``, ``bpd_sum`` and ``mse_sum`` (for reduction across ranks).

    ``bpd = bpd_sum / count``; ``mse = mse_sum / count`` is the mean eps-MSE over the timesteps.
    """
    generator = torch.Generator().manual_seed(seed)
    num_t = len(timesteps.timesteps)
    count = torch.zeros((), dtype=torch.float64)
    bpd_sum = torch.zeros((), dtype=torch.float64)
    mse_sum = torch.zeros((), dtype=torch.float64)
    for x, cond in batches:
        terms = bound_terms(
            diffusion=diffusion,
            model=model,
            x_start=x,
            timesteps=timesteps,
            model_kwargs=cond,
            generator=generator,
        )
        bpd = terms["prior"] + terms["vb_sum"]
        count += x.shape[0]
        bpd_sum += bpd.double().sum().cpu()
        mse_sum += (terms["mse_sum"] / num_t).double().sum().cpu()
    return {"count": count, "bpd_sum": bpd_sum, "mse_sum": mse_sum}


def validation_metrics(totals: dict[str, torch.Tensor]) -> dict[str, float]:
    """``val_bpd`` and ``val_mse`` from :func:`estimate_bpd`'s totals (summed over ranks first)."""
    count = float(totals["count"])
    return {
        "val_bpd": float(totals["bpd_sum"]) / count,
        "val_mse": float(totals["mse_sum"]) / count,
    }
