"""Time one diffusion training step (training_losses + backward + AdamW) for raydiff vs the reference.

Config (IDDPM CIFAR-like, scaled down): batch 16 of 32x32x3, model_channels 64, 2 res blocks,
channel_mult (1, 2, 2, 2), attention at 16x16 and 8x8 (ds 2, 4), 4 heads, scale-shift norm,
dropout 0.1, learned sigma (LEARNED_RANGE + RESCALED_MSE hybrid loss), cosine schedule, T = 1000,
uniform timestep sampling. The optimiser is AdamW as each side builds it: raydiff's
``build_optimizer`` (fused) and torch's default AdamW for the reference (improved-diffusion's
TrainLoop).

Modes are ``IMPL-PRECISION[-compile]`` with IMPL in {raydiff, ref} and PRECISION in
{fp32, bf16, fp16}: bf16/fp16 are ``torch.autocast("cpu")``; fp16 also uses
``torch.amp.GradScaler("cpu")``. ``ref-*`` needs ``--reference-root`` (improved-diffusion's own
UNetModel + GaussianDiffusion.training_losses + UniformSampler). Modes run round-robin, one step
each per round, so machine noise hits every mode alike; the reported time is the median over
rounds after warm-up. fp16 autocast convolutions are ~25x slower on this CPU, so fp16 modes run
``--fp16-steps`` timed steps instead of ``--steps``.

Throughput in GFLOP/s uses 3x the forward FLOPs per training step (forward + ~2x for backward),
counted by ``torch.utils.flop_counter.FlopCounterMode`` on one fp32 forward of the model; the
diffusion arithmetic and the optimizer are not counted.

Minor page faults per step are counted too (``getrusage``, median over the timed steps): glibc
hands freed activation memory back to the kernel between steps, and a step that regrows it
faults every page in again.

Example::

    python bench/core_step.py --reference-root .reference --steps 10 --warmup 2 --profile
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

BATCH = 16
IMAGE_SIZE = 32
T = 1000
UNET_KWARGS: dict[str, Any] = dict(
    in_channels=3,
    model_channels=64,
    out_channels=6,  # learn_sigma doubles the output channels
    num_res_blocks=2,
    attention_resolutions=(2, 4),  # 32 // 16, 32 // 8
    dropout=0.1,
    channel_mult=(1, 2, 2, 2),
    num_heads=4,
    use_scale_shift_norm=True,
)
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
DEFAULT_MODES = (
    "raydiff-fp32",
    "raydiff-bf16",
    "raydiff-fp16",
    "raydiff-fp32-compile",
    "raydiff-bf16-compile",
    "ref-fp32",
    "ref-bf16",
)


@dataclass
class ModeResult:
    """Timings of one mode."""

    mode: str
    step_times_s: list[float] = field(default_factory=list)
    minor_faults: list[int] = field(default_factory=list)
    median_s: float = float("nan")
    images_per_s: float = float("nan")
    gflop_per_s: float = float("nan")
    warmup_s: float = float("nan")
    error: str | None = None


class Stepper:
    """One implementation + precision: builds model, diffusion, sampler and optimizer."""

    def __init__(self, mode: str, lib: Any, x: torch.Tensor) -> None:
        parts = mode.split("-")
        self.mode = mode
        self.impl, precision = parts[0], parts[1]
        self.compile = "compile" in parts[2:]
        self.dtype = PRECISIONS[precision]
        torch.manual_seed(0)
        kwargs = dict(UNET_KWARGS)
        if self.impl == "raydiff":
            kwargs["image_size"] = IMAGE_SIZE
        self.model = lib.UNetModel(**kwargs).train()
        self.diffusion = lib.GaussianDiffusion(
            betas=lib.get_named_beta_schedule("cosine", T),
            model_mean_type=lib.ModelMeanType.EPSILON,
            model_var_type=lib.ModelVarType.LEARNED_RANGE,
            loss_type=lib.LossType.RESCALED_MSE,
            rescale_timesteps=True,
        )
        self.sampler = lib.UniformSampler(self.diffusion)
        if self.impl == "raydiff":
            # What raydiff's RankOptimizer steps with (fused AdamW); the reference keeps torch's default
            # AdamW, as improved-diffusion's TrainLoop builds it.
            from raydiff.config import OptimConfig
            from raydiff.train.rank_optimizer import build_optimizer

            self.opt = build_optimizer(
                self.model.parameters(), optim=OptimConfig(lr=1e-4, weight_decay=0.0)
            )
        else:
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, weight_decay=0.0)
        self.scaler = torch.amp.GradScaler("cpu") if self.dtype == torch.float16 else None
        self.net: Callable[..., torch.Tensor] = (
            torch.compile(self.model) if self.compile else self.model
        )
        self.x = x

    def step(self) -> float:
        """Run one optimisation step and return its wall time in seconds."""
        start = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        t, weights = self.sampler.sample(BATCH, "cpu")
        ctx = torch.autocast("cpu", dtype=self.dtype) if self.dtype is not None else nullcontext()
        with ctx:
            losses = self.diffusion.training_losses(self.net, self.x, t)
        loss = (losses["loss"].float() * weights).mean()
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            loss.backward()
            self.opt.step()
        return time.perf_counter() - start


def forward_gflop(lib: Any, impl: str) -> float:
    """Forward FLOPs (GFLOP) of the model on one batch, fp32, via FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    kwargs = dict(UNET_KWARGS)
    if impl == "raydiff":
        kwargs["image_size"] = IMAGE_SIZE
    model = lib.UNetModel(**kwargs).eval()
    x = torch.randn(BATCH, 3, IMAGE_SIZE, IMAGE_SIZE)
    t = torch.randint(0, T, (BATCH,)).float()
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(x, t)
    return counter.get_total_flops() / 1e9


def profile_step(stepper: Stepper, top: int) -> list[dict[str, Any]]:
    """Top ops by self CPU time for one training step."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        stepper.step()
    rows = []
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    for e in events[:top]:
        rows.append(
            {
                "op": e.key,
                "self_ms": e.self_cpu_time_total / 1e3,
                "share": e.self_cpu_time_total / total,
                "calls": e.count,
            }
        )
    return rows


def load_libs(reference_root: Path | None) -> dict[str, Any]:
    """raydiff.core, plus improved-diffusion's modules when a reference root is given."""
    # Run as a script from anywhere: make the repository root importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import raydiff.core as core

    libs: dict[str, Any] = {"raydiff": core}
    if reference_root is not None:
        sys.path.insert(0, str(Path(__file__).parent))
        from make_reference_fixtures import import_reference

        improved, _ = import_reference(reference_root)
        import improved_diffusion.resample as resample

        improved.UniformSampler = resample.UniformSampler
        libs["ref"] = improved
    return libs


def main() -> None:
    """Parse arguments, time every mode round-robin, print a table and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--steps", type=int, default=10, help="timed steps per mode (>= 10 for the report)"
    )
    parser.add_argument(
        "--warmup", type=int, default=2, help="untimed steps per mode first (compile happens here)"
    )
    parser.add_argument(
        "--fp16-steps",
        type=int,
        default=3,
        help="timed steps for fp16 modes (fp16 CPU convs are ~25x slower)",
    )
    parser.add_argument(
        "--modes",
        default=",".join(DEFAULT_MODES),
        help="comma-separated IMPL-PRECISION[-compile] modes",
    )
    parser.add_argument("--no-compile", action="store_true", help="drop every *-compile mode")
    parser.add_argument(
        "--reference-root",
        type=Path,
        default=None,
        help="folder with improved-diffusion/ (enables ref-* modes)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="print torch.profiler top ops (one extra step) for every mode that ran",
    )
    parser.add_argument("--profile-top", type=int, default=15, help="rows per profile table")
    parser.add_argument(
        "--out", type=Path, default=Path("bench/results/core_step.json"), help="JSON output path"
    )
    args = parser.parse_args()

    libs = load_libs(args.reference_root)
    modes = [m for m in args.modes.split(",") if m]
    if args.no_compile:
        modes = [m for m in modes if not m.endswith("-compile")]
    modes = [m for m in modes if m.split("-")[0] in libs]
    torch.manual_seed(0)
    x = torch.rand(BATCH, 3, IMAGE_SIZE, IMAGE_SIZE) * 2 - 1

    gflop = {impl: forward_gflop(lib, impl) for impl, lib in libs.items()}
    steppers: dict[str, Stepper] = {}
    results: dict[str, ModeResult] = {}
    for mode in modes:
        res = ModeResult(mode)
        results[mode] = res
        try:
            steppers[mode] = Stepper(mode, libs[mode.split("-")[0]], x)
            start = time.perf_counter()
            for _ in range(args.warmup):
                steppers[mode].step()
            res.warmup_s = time.perf_counter() - start
            print(f"warm-up {mode}: {res.warmup_s:.1f}s", flush=True)
        except Exception as exc:  # report and go on: one broken mode must not hide the others
            res.error = f"{type(exc).__name__}: {exc}"[:300]
            steppers.pop(mode, None)
            print(f"{mode}: {res.error}", flush=True)

    # Round-robin so that slow drifts of the machine (thermal, other jobs) hit every mode.
    for r in range(args.steps):
        for mode, stepper in steppers.items():
            limit = args.fp16_steps if "fp16" in mode else args.steps
            if r < limit:
                faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                results[mode].step_times_s.append(stepper.step())
                results[mode].minor_faults.append(
                    resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
                )
        latest = ", ".join(
            f"{m} {res.step_times_s[-1]:.2f}s"
            for m, res in results.items()
            if len(res.step_times_s) == r + 1
        )
        print(f"round {r + 1}/{args.steps}: {latest}", flush=True)

    for mode, res in results.items():
        if res.step_times_s:
            res.median_s = statistics.median(res.step_times_s)
            res.images_per_s = BATCH / res.median_s
            res.gflop_per_s = 3 * gflop[mode.split("-")[0]] / res.median_s

    profiles: dict[str, list[dict[str, Any]]] = {}
    if args.profile:
        for mode, stepper in steppers.items():
            if results[mode].step_times_s:
                profiles[mode] = profile_step(stepper, args.profile_top)

    ref = results.get("ref-fp32")
    ref_ips = ref.images_per_s if ref and ref.step_times_s else float("nan")
    print()
    print(
        f"forward GFLOP per batch of {BATCH}: "
        + ", ".join(f"{k} {v:.2f}" for k, v in gflop.items())
    )
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    header = (
        f"{'mode':24s} {'n':>3s} {'s/step':>8s} {'img/s':>8s} {'GFLOP/s':>8s} {'vs ref-fp32':>11s}"
        f" {'faults/step':>11s}"
    )
    print(header)
    print("-" * len(header))
    for mode, res in results.items():
        if res.error:
            print(f"{mode:24s} ERROR {res.error}")
            continue
        ratio = res.images_per_s / ref_ips if ref_ips == ref_ips else float("nan")
        print(
            f"{mode:24s} {len(res.step_times_s):3d} {res.median_s:8.3f} {res.images_per_s:8.2f} "
            f"{res.gflop_per_s:8.2f} {ratio:10.2f}x {statistics.median(res.minor_faults):11.0f}"
        )
    raydiff_ok = [r for m, r in results.items() if m.startswith("raydiff") and r.step_times_s]
    if ref_ips == ref_ips and raydiff_ok:
        fp32 = results.get("raydiff-fp32")
        best = max(raydiff_ok, key=lambda r: r.images_per_s)
        if fp32 and fp32.step_times_s:
            print(
                f"\nraydiff-fp32 / ref-fp32 = {fp32.images_per_s / ref_ips:.2f}x (target >= 1.25x)"
            )
        print(
            f"fastest raydiff ({best.mode}) / ref-fp32 = {best.images_per_s / ref_ips:.2f}x (target >= 2x)"
        )
    for mode, rows in profiles.items():
        print(f"\nprofile {mode} (one step, self CPU time)")
        for row in rows:
            print(
                f"  {row['op'][:48]:48s} {row['self_ms']:9.1f} ms {100 * row['share']:5.1f}% x{row['calls']}"
            )

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "config": {"batch": BATCH, "image_size": IMAGE_SIZE, "T": T, "unet": UNET_KWARGS},
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "forward_gflop": gflop,
                "flops_note": "GFLOP/s = 3 x forward FLOPs / step time (backward ~ 2x forward)",
                "results": {m: asdict(r) for m, r in results.items()},
                "profiles": profiles,
            },
            indent=1,
        )
    )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
