"""What post-hoc EMA tracking costs a demo step, and what its snapshots weigh.

Builds the demo model (``configs/demo.yaml``, one worker's batch of 32 at 32x32x1) in one
process and times, interleaved over ``--rounds`` rounds, one optimiser step
(``RankOptimizer.optimize``) without tracking and with EDM2's two profiles (sigma_rel 0.05 and
0.10); then one profile update alone, and one snapshot (the profiles in fp16, written with
``torch.save``), whose cost is spread over ``--interval`` steps:

    python bench/posthoc_ema_cost.py                # 20 rounds of 5 steps, snapshots every 50

Prints the medians and the overhead as a share of the untracked step (target: at most 2%). The
figures in docs/performance.md ("Post-hoc EMA") are this script's output.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from raydiff.config import apply_overrides, load_config
from raydiff.train.build import build_rank_optimizer
from raydiff.train.local import LocalRuntime
from raydiff.train.tasks import task_of_config

BATCH = 32


def optimizer(posthoc: bool, images: torch.Tensor):
    overrides = [f"train.batch_size={BATCH}", "scaling.num_workers=1", "train.precision=fp32"]
    if posthoc:
        overrides.append("optim.posthoc_ema_stds=0.05,0.10")
    config = apply_overrides(load_config("demo"), overrides)
    with tempfile.TemporaryDirectory() as out:
        runtime = LocalRuntime(
            config, output_dir=Path(out), resume=None, images=images, labels=None
        )
        _, rank_optimizer = build_rank_optimizer(config, runtime=runtime, make_task=task_of_config)
    return rank_optimizer


def time_steps(rank_optimizer, batch: dict, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        rank_optimizer.optimize(batch)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5, help="steps per round and variant")
    parser.add_argument("--interval", type=int, default=50, help="steps between snapshots")
    args = parser.parse_args()
    torch.manual_seed(0)
    images = torch.rand(BATCH, 1, 32, 32) * 2 - 1
    batch = {"x": images, "index": torch.arange(BATCH)}
    plain, tracked = optimizer(False, images), optimizer(True, images)
    for variant in (plain, tracked):  # warm-up
        time_steps(variant, batch, 2)
    plain_s, tracked_s = [], []
    for _ in range(args.rounds):
        plain_s.append(time_steps(plain, batch, args.steps))
        tracked_s.append(time_steps(tracked, batch, args.steps))
    profiles = tracked.posthoc_ema
    updates = []
    for _ in range(50):
        start = time.perf_counter()
        profiles.update(tracked.raw_model, step=tracked.step + 1)
        tracked.step += 1
        updates.append(time.perf_counter() - start)
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        path = Path(folder) / "snapshot.pt"
        torch.save({"step": tracked.step, "profiles": profiles.snapshot()}, path)
        snapshot_s = time.perf_counter() - start
        size = path.stat().st_size
    step = statistics.median(plain_s)
    update = statistics.median(updates)
    params = sum(p.numel() for p in tracked.raw_model.parameters())
    print(f"demo model: {params / 1e6:.2f}M parameters, batch {BATCH}, fp32, 2 profiles")
    print(f"step without tracking: median {step * 1e3:.1f} ms ({args.rounds} rounds)")
    print(f"step with tracking:    median {statistics.median(tracked_s) * 1e3:.1f} ms")
    print(f"one profile update:    median {update * 1e3:.2f} ms = {update / step:.2%} of a step")
    print(
        f"one snapshot: {snapshot_s * 1e3:.1f} ms, {size / 1e6:.2f} MB; every {args.interval} "
        f"steps: {snapshot_s / args.interval / step:.3%} of a step"
    )
    print(f"tracking in all: {(update + snapshot_s / args.interval) / step:.2%} of a step")


if __name__ == "__main__":
    main()
