"""How much the validation bits/dim estimate moves with its draw of timesteps.

``val_bpd`` estimates the NLL bound ``L_prior + sum_t L_t`` from K timesteps drawn once per run
(``raydiff.train.validation``). This script evaluates every term ``L_t`` of a checkpoint's EMA
weights on a few val images (T model calls per image: the exact bound, as ``calc_bpd_loop``), then
replays many draws of K timesteps over those terms and prints the spread of the estimate for
raydiff's strata (``t = T-1`` alone, geometric strata over ``[0, T-1)``) and for K equal strata
(one t per ``T/K`` block, the textbook choice), next to the exact bound.

    python bench/val_bpd_spread.py --checkpoint runs/demo/checkpoint_000600 --images 16

Takes about 30 s per 1000 timesteps for the demo model on 2 cores. Writes JSON under
``bench/results/``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from raydiff.config import ExperimentConfig, from_dict  # noqa: E402
from raydiff.data.in_memory import load_split_tensors  # noqa: E402
from raydiff.factory import create_gaussian_diffusion, create_model  # noqa: E402
from raydiff.train.checkpoint import load_checkpoint  # noqa: E402
from raydiff.train.validation import bound_terms, stratified_timesteps  # noqa: E402


def equal_strata(num_timesteps: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """One t per equal stratum of [0, T): each counts T / count times."""
    edges = torch.linspace(0, num_timesteps, count + 1, dtype=torch.float64)
    u = torch.rand(count, generator=generator, dtype=torch.float64)
    return (
        torch.floor(edges[:-1] + u * (edges[1:] - edges[:-1])).long().clamp(max=num_timesteps - 1)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="a checkpoint_NNNNNN folder")
    parser.add_argument("--images", type=int, default=16, help="val images (default: 16)")
    parser.add_argument("--counts", default="10,20", help="K values to compare (default: 10,20)")
    parser.add_argument("--draws", type=int, default=500, help="draws of timesteps per K")
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "results" / "val_bpd_spread.json"
    )
    args = parser.parse_args()

    state = load_checkpoint(args.checkpoint)
    config = from_dict(ExperimentConfig, state["config"])
    model = create_model(config.model, learn_sigma=config.diffusion.learn_sigma)
    rates = sorted(state["ema"])
    model.load_state_dict(state["ema"][rates[0]] if rates else state["model"])
    model.eval()
    diffusion = create_gaussian_diffusion(config.diffusion)
    images, _, _ = load_split_tensors(
        config.data.data_dir, config.data.val_split, limit=args.images
    )
    x = images.float() / 127.5 - 1 if images.dtype == torch.uint8 else images.float()
    num_t = diffusion.num_timesteps

    start = time.perf_counter()
    generator = torch.Generator().manual_seed(0)
    every = stratified_timesteps(num_t, num_t, seed=0)
    per_t = torch.zeros(num_t, dtype=torch.float64)
    prior = 0.0
    for t in range(num_t):  # one term at a time: its mean over the images
        single = type(every)(torch.tensor([t]), torch.ones(1, dtype=torch.float64))
        terms = bound_terms(
            diffusion=diffusion, model=model, x_start=x, timesteps=single, generator=generator
        )
        per_t[t] = terms["vb_sum"].double().mean()
        prior = float(terms["prior"].double().mean())
        if (t + 1) % 100 == 0:
            print(f"  {t + 1}/{num_t} terms ({time.perf_counter() - start:.0f} s)", flush=True)
    exact = prior + float(per_t.sum())
    top = torch.topk(per_t, 3)
    print(
        f"\n{args.checkpoint} (EMA {rates[0] if rates else 'none'}), {x.shape[0]} val images, "
        f"T={num_t}: exact bound {exact:.3f} bits/dim (prior {prior:.4f}); largest terms "
        + ", ".join(
            f"L_{int(i)}={float(v):.3f}" for v, i in zip(top.values, top.indices, strict=True)
        )
    )

    rows = []
    print(f"{'K':>4s} {'strata':>9s} {'mean':>8s} {'sd':>8s} {'min':>8s} {'max':>8s}")
    for count in (int(c) for c in args.counts.split(",")):
        for name in ("raydiff", "equal"):
            estimates = []
            for seed in range(args.draws):
                if name == "raydiff":
                    b = stratified_timesteps(num_t, count, seed=seed)
                    estimates.append(prior + float((b.weights * per_t[b.timesteps]).sum()))
                else:
                    t = equal_strata(num_t, count, torch.Generator().manual_seed(seed))
                    estimates.append(prior + num_t / count * float(per_t[t].sum()))
            row = {
                "K": count,
                "strata": name,
                "mean": statistics.mean(estimates),
                "sd": statistics.pstdev(estimates),
                "min": min(estimates),
                "max": max(estimates),
            }
            rows.append(row)
            print(
                f"{count:4d} {name:>9s} {row['mean']:8.3f} {row['sd']:8.3f} {row['min']:8.3f} "
                f"{row['max']:8.3f}"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "checkpoint": str(args.checkpoint),
                "images": int(x.shape[0]),
                "T": num_t,
                "exact_bpd": exact,
                "prior": prior,
                "per_t": per_t.tolist(),
                "draws": args.draws,
                "rows": rows,
            },
            indent=1,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
