"""The training step eager and with ``train.compile=true``, on this machine's CPU or GPU.

What ``train.compile: auto`` decides: the per-rank step (``RankOptimizer.optimize``: the task's
loss, backward, clipping, AdamW, EMA) of a config, built by ``build_rank_optimizer`` as a run
builds it, on random images of the config's shape. The compiled trainer's first step is timed on
its own (the compile: cold, into a fresh inductor cache folder unless ``--cache-dir`` names a
warm one), then the eager and compiled steps alternate (one each per round, so machine noise
hits both) and the medians after ``--warmup`` rounds are compared. Default: the demo config
(configs/demo.yaml) at its per-worker batch (32 over 2 workers: 16).

Example::

    python bench/compile_step.py --steps 20 --warmup 3
    python bench/compile_step.py --config configs/demo.yaml --precision bf16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from raydiff.config import ExperimentConfig, apply_overrides, load_config  # noqa: E402


def build_trainer(config: ExperimentConfig, *, compiled: bool, device: torch.device) -> Any:
    """The trainer a one-worker run of ``config`` builds (``train.compile`` as asked)."""
    from raydiff.train.build import build_rank_optimizer
    from raydiff.train.local import LocalRuntime
    from raydiff.train.tasks import task_of_config

    config = apply_overrides(config, [f"train.compile={'true' if compiled else 'false'}"])
    model = config.model
    images = torch.zeros(1, model.in_channels, model.image_size, model.image_size)
    runtime = LocalRuntime(
        config,
        output_dir=Path(tempfile.mkdtemp()),
        resume=None,
        images=images,
        labels=None,
        device=device,
    )
    _, trainer = build_rank_optimizer(config, runtime=runtime, make_task=task_of_config)
    return trainer


def random_batch(config: ExperimentConfig, *, batch: int, device: torch.device) -> dict:
    model = config.model
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch, model.in_channels, model.image_size, model.image_size, generator=g)
    out = {"x": (x * 2 - 1).to(device), "index": torch.arange(batch)}
    if model.class_cond:
        out["y"] = torch.randint(0, model.num_classes, (batch,), generator=g).to(device)
    return out


def timed_step(trainer: Any, batch: dict, device: torch.device) -> tuple[float, float]:
    """Seconds of one step and its mean loss."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = trainer.optimize(batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, float(result.losses["loss"].mean())


def measure(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device("cuda" if args.gpu else "cpu")
    config = load_config(args.config)
    config = apply_overrides(
        config,
        [
            f"train.batch_size={args.batch}",
            "train.microbatch=-1",
            f"train.precision={args.precision}",
            f"scaling.use_gpu={args.gpu}",
        ],
    )
    batch = random_batch(config, batch=args.batch, device=device)
    eager = build_trainer(config, compiled=False, device=device)
    compiled = build_trainer(config, compiled=True, device=device)
    compile_s, compiled_loss = timed_step(compiled, batch, device)
    _, eager_loss = timed_step(eager, batch, device)
    # Both trainers start from the same weights and draw the same timesteps and noise each
    # step: their losses differ by the compiled kernels' rounding (and dropout's masks).
    losses: dict[str, list[float]] = {"eager": [eager_loss], "compiled": [compiled_loss]}
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(args.warmup + args.steps):
        for name, trainer in (("eager", eager), ("compiled", compiled)):
            seconds, loss = timed_step(trainer, batch, device)
            times[name].append(seconds)
            losses[name].append(loss)
    medians = {k: statistics.median(v[args.warmup :]) for k, v in times.items()}
    differences = [
        abs(c - e) / abs(e) for e, c in zip(losses["eager"], losses["compiled"], strict=True)
    ]
    return {
        "config": args.config,
        "batch": args.batch,
        "precision": eager.precision.precision,
        "device": torch.cuda.get_device_name() if args.gpu else f"CPU, {os.cpu_count()} cores",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "first_compiled_step_s": compile_s,
        "median_step_s": medians,
        "images_per_s": {k: args.batch / v for k, v in medians.items()},
        "compiled_vs_eager": medians["eager"] / medians["compiled"],
        "loss_relative_difference_max": max(differences),
        "step_times_s": times,
        "losses": losses,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/demo.yaml", help="a config file or preset")
    parser.add_argument("--batch", type=int, default=16, help="images per step (one worker's)")
    parser.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16", "fp16"))
    parser.add_argument("--steps", type=int, default=20, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    parser.add_argument("--gpu", action="store_true", help="on the CUDA GPU")
    parser.add_argument(
        "--cache-dir",
        default=None,
        help="inductor's cache folder (default: a fresh one: the compile is timed cold)",
    )
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "compile_step.json"))
    args = parser.parse_args()
    if args.gpu and not torch.cuda.is_available():
        parser.error(f"--gpu: torch {torch.__version__} sees no CUDA GPU here")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = args.cache_dir or tempfile.mkdtemp(prefix="inductor-")
    result = measure(args)
    print(
        f"{result['config']}, batch {result['batch']}, {result['precision']}, "
        f"{result['device']}, {result['threads']} threads, torch {result['torch']}"
    )
    print(f"first compiled step (compiling): {result['first_compiled_step_s']:.1f} s")
    print("| step | median s/step | images/s |\n|---|---|---|")
    for name in ("eager", "compiled"):
        print(
            f"| {name} | {result['median_step_s'][name]:.4f} | {result['images_per_s'][name]:.1f} |"
        )
    print(f"compiled / eager speed: {result['compiled_vs_eager']:.2f}x")
    print(
        "largest relative difference of a step's loss, compiled against eager: "
        f"{result['loss_relative_difference_max']:.2e}"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
