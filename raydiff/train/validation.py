"""Validation: an unbiased estimate of the NLL bound (bits/dim) from a fixed set of timesteps.

The full bound of IDDPM eq. 5 is ``L_prior + sum_t L_t`` over all T steps, which ``calc_bpd_loop``
computes exactly at the cost of T model calls per image. During training we estimate it with K
stratified timesteps instead: the steps are split into K equal strata, one t is drawn in each
(once, from a fixed seed, so every evaluation uses the same set), and
``L_prior + (T / K) * sum_k L_{t_k}`` is unbiased for the bound over the draw of the t_k. Every
image sees every stratum, so the estimate's variance stays low; the numbers are comparable between
evaluations and runs with the same seed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

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


def stratified_timesteps(num_timesteps: int, num_strata: int, *, seed: int) -> torch.Tensor:
    """One timestep drawn uniformly inside each of ``num_strata`` equal strata of [0, T)."""
    if not 1 <= num_strata <= num_timesteps:
        raise ValueError(
            f"eval timesteps must lie in [1, {num_timesteps}] (the diffusion's steps), got {num_strata}"
        )
    g = torch.Generator().manual_seed(seed)
    edges = torch.linspace(0, num_timesteps, num_strata + 1, dtype=torch.float64)
    u = torch.rand(num_strata, generator=g, dtype=torch.float64)
    t = torch.floor(edges[:-1] + u * (edges[1:] - edges[:-1])).long()
    return t.clamp(0, num_timesteps - 1)


@torch.no_grad()
def bound_terms(
    *,
    diffusion: GaussianDiffusion,
    model: Callable[..., torch.Tensor],
    x_start: torch.Tensor,
    timesteps: torch.Tensor,
    model_kwargs: dict[str, torch.Tensor] | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, torch.Tensor]:
    """Per-image sums for the estimate over ``timesteps``: ``vb_sum``, ``mse_sum``, ``prior``.

    ``vb_sum`` is sum_k L_{t_k} in bits/dim, ``mse_sum`` the sum of the eps-MSEs, ``prior`` the
    prior term; all of shape [N].
    """
    vb_sum = torch.zeros(x_start.shape[0], device=x_start.device)
    mse_sum = torch.zeros_like(vb_sum)
    # Walk t downwards like calc_bpd_loop, so with K = T and the same generator both draw the
    # same noise and give the same number.
    for step in sorted(timesteps.tolist(), reverse=True):
        t = torch.full((x_start.shape[0],), step, device=x_start.device, dtype=torch.long)
        noise = torch.randn(
            x_start.shape, generator=generator, device=generator.device if generator else None
        ).to(x_start)
        x_t = diffusion.q_sample(x_start, t, noise=noise)
        out = diffusion._vb_terms_bpd(
            model, x_start=x_start, x_t=x_t, t=t, clip_denoised=False, model_kwargs=model_kwargs
        )
        vb_sum += out["output"].float()
        eps = diffusion._predict_eps_from_xstart(x_t, t, out["pred_xstart"])
        mse_sum += mean_flat((eps - noise) ** 2).float()
    return {"vb_sum": vb_sum, "mse_sum": mse_sum, "prior": diffusion._prior_bpd(x_start).float()}


def estimate_bpd(
    *,
    diffusion: GaussianDiffusion,
    model: Callable[..., torch.Tensor],
    batches: Iterable[tuple[torch.Tensor, dict[str, torch.Tensor]]],
    timesteps: torch.Tensor,
    seed: int,
) -> dict[str, torch.Tensor]:
    """Totals over ``batches``: ``count``, ``bpd_sum`` and ``mse_sum`` (for reduction across ranks).

    ``bpd = bpd_sum / count``; ``mse = mse_sum / count`` is the mean eps-MSE over the timesteps.
    """
    generator = torch.Generator().manual_seed(seed)
    scale = diffusion.num_timesteps / len(timesteps)
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
        bpd = terms["prior"] + scale * terms["vb_sum"]
        count += x.shape[0]
        bpd_sum += bpd.double().sum().cpu()
        mse_sum += (terms["mse_sum"] / len(timesteps)).double().sum().cpu()
    return {"count": count, "bpd_sum": bpd_sum, "mse_sum": mse_sum}


def validation_metrics(totals: dict[str, torch.Tensor]) -> dict[str, float]:
    """``val_bpd`` and ``val_mse`` from :func:`estimate_bpd`'s totals (summed over ranks first)."""
    count = float(totals["count"])
    return {
        "val_bpd": float(totals["bpd_sum"]) / count,
        "val_mse": float(totals["mse_sum"]) / count,
    }
