"""Images/s of one CIFAR-10 hybrid training step on a CUDA GPU: raydiff in fp16 and bf16 against
improved-diffusion's own ``--use_fp16`` step, in the same process.

The model and diffusion are configs/cifar10_hybrid.yaml's (52.5M parameters, 32x32x3, 4000 cosine
steps, learned sigmas, dropout 0.3), with its batch of 128 on the one GPU.

* raydiff-fp16 / raydiff-bf16: raydiff's training step (``RankOptimizer.optimize`` as
  ``raydiff.train.build.build_rank_optimizer`` assembles it for one process): autocast with fp32 weights,
  ``torch.amp.GradScaler`` for fp16, fused AdamW, the EMA update.
* ref-fp16: improved-diffusion's ``TrainLoop.run_step`` with ``use_fp16=True``, as
  improved-diffusion's ``image_train.py --use_fp16 True`` runs it on one GPU: the model converted to fp16, fp32
  master parameters, its own loss scaling, AdamW and the EMA update, the model wrapped in DDP over
  a one-process NCCL group (``TrainLoop`` always wraps it on CUDA). The code is the reference
  checkout's (``--reference-root``, default ``.reference``: ``.reference/improved-diffusion``),
  imported as bench/make_reference_fixtures.py does; it is not part of the repository.
  improved-diffusion imports ``mpi4py`` (its launcher is ``mpiexec``) and ``blobfile`` (for
  checkpoints): when they are not installed, a one-process ``MPI.COMM_WORLD`` (rank 0 of 1) and an
  empty ``blobfile`` stand in, which is all one process's step touches.

Modes run round-robin, one step each per round, so drifts of the machine hit them alike; each step
is timed between two ``torch.cuda.synchronize()`` calls, and the median after the warm-up counts.
The batch is the same random images for every mode (a step's cost does not depend on pixels).

Usage (on a machine with a CUDA GPU; without one it says so and exits with status 2)::

    python bench/gpu_step.py --reference-root .reference     # or: make bench-gpu
    python bench/gpu_step.py --no-reference                  # raydiff's modes only
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: raydiff from this checkout

from raydiff.config import ExperimentConfig, apply_overrides, load_config  # noqa: E402

PRESET = "cifar10_hybrid"


def require_cuda() -> torch.device:
    """The GPU, or exit with status 2 saying why there is none."""
    if not torch.cuda.is_available():
        sys.stderr.write(
            "bench/gpu_step.py measures a training step on a CUDA GPU, and this machine has none "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}: "
            "torch.cuda.is_available() is False). Run it on a GPU machine: make bench-gpu\n"
        )
        raise SystemExit(2)
    return torch.device("cuda", torch.cuda.current_device())


def preset(batch: int, precision: str) -> ExperimentConfig:
    """The CIFAR-10 hybrid preset, trained by one process at ``precision``."""
    return apply_overrides(
        load_config(PRESET),
        [f"train.batch_size={batch}", f"train.precision={precision}", "scaling.num_workers=1"],
    )


def raydiff_step(config: ExperimentConfig, images: torch.Tensor, device: torch.device) -> Callable:
    """raydiff's training step for ``config`` on ``device``."""
    from raydiff.train.build import build_rank_optimizer
    from raydiff.train.data_position import DataPosition
    from raydiff.train.local import LocalRuntime
    from raydiff.train.tasks.diffusion import diffusion_task

    runtime = LocalRuntime(
        config,
        output_dir=Path(tempfile.mkdtemp(prefix="gpu_step-")),
        resume=None,
        images=images,
        labels=None,
        device=device,
    )
    _, trainer = build_rank_optimizer(config, runtime=runtime, make_task=diffusion_task)
    trainer.raw_model.train()
    # One batch as the runtime hands it to the loop (on the device, flipped as configured),
    # reused for every step: a step's cost does not depend on the pixels.
    _, batch = next(
        runtime.train_batches(batch_size=config.train.batch_size, position=DataPosition())
    )
    return lambda: trainer.optimize(batch)


def import_improved_diffusion(root: Path) -> types.SimpleNamespace:
    """improved-diffusion's script_util, resample, train_util, dist_util and logger from
    ``root/improved-diffusion``."""
    package_parent = root / "improved-diffusion"
    if not (package_parent / "improved_diffusion" / "train_util.py").is_file():
        raise SystemExit(
            f"no improved-diffusion checkout at {package_parent} (its improved_diffusion/"
            "train_util.py is missing): pass --reference-root with the folder that holds "
            "improved-diffusion/, or --no-reference for raydiff's modes only"
        )
    sys.path.insert(0, str(package_parent))
    if importlib.util.find_spec("mpi4py") is None:
        sys.modules["mpi4py"], sys.modules["mpi4py.MPI"] = _one_process_mpi()
    if importlib.util.find_spec("blobfile") is None:
        # Used by TrainLoop's checkpoint saving and resuming only, which the bench never calls.
        sys.modules["blobfile"] = types.ModuleType("blobfile")
    import improved_diffusion.dist_util as dist_util
    import improved_diffusion.logger as logger
    import improved_diffusion.resample as resample
    import improved_diffusion.script_util as script_util
    import improved_diffusion.train_util as train_util

    return types.SimpleNamespace(
        dist_util=dist_util,
        logger=logger,
        resample=resample,
        script_util=script_util,
        train_util=train_util,
    )


def _one_process_mpi() -> tuple[types.ModuleType, types.ModuleType]:
    """``mpi4py`` and ``mpi4py.MPI`` for one process: ``COMM_WORLD`` is rank 0 of 1."""

    class OneProcessComm:
        rank, size = 0, 1

        def Get_rank(self) -> int:  # mpi4py's method names
            return 0

        def Get_size(self) -> int:
            return 1

        def bcast(self, value: Any, root: int = 0) -> Any:
            return value

        def barrier(self) -> None:
            return None

    mpi4py, mpi = types.ModuleType("mpi4py"), types.ModuleType("mpi4py.MPI")
    mpi.COMM_WORLD = OneProcessComm()
    mpi4py.MPI = mpi
    return mpi4py, mpi


def reference_step(
    ref: types.SimpleNamespace, config: ExperimentConfig, images: torch.Tensor
) -> Callable:
    """improved-diffusion's ``--use_fp16`` training step for the preset's model and diffusion."""
    import torch.distributed as dist

    if not dist.is_initialized():  # TrainLoop wraps the model in DDP on CUDA: one rank of one
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    ref.logger.configure(dir=tempfile.mkdtemp(prefix="gpu_step-ref-"), format_strs=[])
    flags = ref.script_util.model_and_diffusion_defaults()
    for name in flags:  # raydiff's model and diffusion fields carry improved-diffusion's names
        section = config.model if hasattr(config.model, name) else config.diffusion
        if not hasattr(section, name):
            raise SystemExit(f"improved-diffusion's flag {name} has no raydiff config field")
        flags[name] = getattr(section, name)
    torch.manual_seed(0)
    model, diffusion = ref.script_util.create_model_and_diffusion(**flags)
    model.to(ref.dist_util.dev())
    loop = ref.train_util.TrainLoop(
        model=model,
        diffusion=diffusion,
        data=None,  # run_step is given the batch
        batch_size=images.shape[0],
        microbatch=-1,
        lr=config.optim.lr,
        ema_rate=config.optim.ema_rate,
        log_interval=10**9,
        save_interval=10**9,
        resume_checkpoint="",
        use_fp16=True,
        schedule_sampler=ref.resample.create_named_schedule_sampler("uniform", diffusion),
        weight_decay=config.optim.weight_decay,
        lr_anneal_steps=0,
    )
    return lambda: loop.run_step(images, {})


def timed(step: Callable) -> float:
    """Seconds of one step, from an idle GPU to an idle GPU."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def build_modes(args: argparse.Namespace, device: torch.device) -> dict[str, Callable]:
    torch.manual_seed(0)
    images = torch.rand(args.batch, 3, 32, 32).mul_(2).sub_(1).pin_memory()
    modes = {"raydiff-fp16": raydiff_step(preset(args.batch, "fp16"), images, device)}
    if torch.cuda.is_bf16_supported():
        modes["raydiff-bf16"] = raydiff_step(preset(args.batch, "bf16"), images, device)
    else:
        print("raydiff-bf16: skipped, this GPU has no bf16", flush=True)
    if not args.no_reference:
        ref = import_improved_diffusion(args.reference_root)
        modes["ref-fp16"] = reference_step(ref, preset(args.batch, "fp16"), images)
    return modes


def run(modes: dict[str, Callable], *, steps: int, warmup: int) -> dict[str, list[float]]:
    """Round-robin: ``warmup`` untimed then ``steps`` timed steps of every mode."""
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for round_ in range(warmup + steps):
        for mode, step in modes.items():
            seconds = timed(step)
            if round_ >= warmup:
                times[mode].append(seconds)
        if round_ + 1 == warmup:
            print(f"warm-up done ({warmup} steps per mode)", flush=True)
    return times


def report(times: dict[str, list[float]], *, batch: int) -> dict[str, Any]:
    rows = {
        mode: {"median_s": statistics.median(ts), "images_per_s": batch / statistics.median(ts)}
        for mode, ts in times.items()
    }
    ref = rows.get("ref-fp16", {}).get("images_per_s")
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(f"{PRESET}, batch {batch}, {len(next(iter(times.values())))} timed steps per mode")
    print(f"{'mode':14s} {'ms/step':>9s} {'images/s':>9s} {'vs ref-fp16':>12s}")
    for mode, row in rows.items():
        ratio = f"{row['images_per_s'] / ref:11.2f}x" if ref else f"{'-':>12s}"
        print(f"{mode:14s} {1e3 * row['median_s']:9.1f} {row['images_per_s']:9.0f} {ratio}")
    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "preset": PRESET,
        "batch": batch,
        "modes": rows,
        "step_times_s": times,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per mode")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per mode first")
    parser.add_argument("--batch", type=int, default=128, help="images per step (the preset's)")
    parser.add_argument(
        "--reference-root",
        type=Path,
        default=REPO / ".reference",
        help="folder holding improved-diffusion/ (default: .reference)",
    )
    parser.add_argument(
        "--no-reference", action="store_true", help="raydiff's modes only (no ref-fp16)"
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench/results/gpu_step.json", help="JSON output"
    )
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.batch < 1:
        parser.error("--steps and --batch must be >= 1, --warmup >= 0")
    device = require_cuda()
    results = report(
        run(build_modes(args, device), steps=args.steps, warmup=args.warmup), batch=args.batch
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
