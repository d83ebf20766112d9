"""Images/s and peak memory of one training step on a CUDA GPU: raydiff eager, compiled, in CUDA
graphs and channels-last, in fp16 and bf16, against improved-diffusion's own ``--use_fp16`` step,
in the same process, for configs/cifar10_hybrid.yaml and configs/imagenet64_cond.yaml.

The models and diffusions are the presets' (cifar10_hybrid: 52.5M parameters, 32x32x3, 4000
cosine steps, learned sigmas, dropout 0.3, its batch of 128 on the one GPU; imagenet64_cond: the
class-conditional 64x64 model with attention at 32, 16 and 8, 64 images per GPU by default, its
2048 being a multi-GPU batch).

* raydiff-fp16 / raydiff-bf16: raydiff's training step (``RankOptimizer.optimize`` as
  ``raydiff.train.build.build_rank_optimizer`` assembles it for one process): autocast with fp32 weights,
  ``torch.amp.GradScaler`` for fp16, fused AdamW, the EMA update.
* raydiff-fp16-compile / raydiff-bf16-compile: the same with ``train.compile=true`` (the model
  compiled by inductor, ``dynamic=False``).
* raydiff-bf16-cudagraphs: compiled with ``mode="reduce-overhead"`` (CUDA graphs: one launch
  for the step's many small kernels), ``torch.compiler.cudagraph_mark_step_begin()`` before each
  step. Not a config option: kept only if it measures faster.
* raydiff-bf16-channels-last / raydiff-bf16-compile-channels-last: the model and the images in
  ``torch.channels_last``, eager and compiled (PyTorch's eager group norm has no channels-last
  CUDA kernel; inductor writes its own). Not a config option either.
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
The first step of each mode is reported apart (for a compiled mode: the compile; cold unless
``--cache-dir`` names inductor's cache folder of an earlier run, which measures a restart's warm
first step). Peak memory per image: the most the caching allocator held during a timed step
above what it held before it (activations, gradients, optimiser temporaries), divided by the
batch. The batch is the same random images (and labels) for every mode.

Usage (on a machine with a CUDA GPU; without one it says so and exits with status 2)::

    python bench/gpu_step.py --reference-root .reference     # or: make bench-gpu
    python bench/gpu_step.py --no-reference                  # raydiff's modes only
    python bench/gpu_step.py --presets cifar10_hybrid --modes raydiff-bf16,raydiff-bf16-compile
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import statistics
import subprocess
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

PRESETS = ("cifar10_hybrid", "imagenet64_cond")
DEFAULT_BATCH = {"cifar10_hybrid": 128, "imagenet64_cond": 64}
RAYDIFF_MODES = (
    "raydiff-fp16",
    "raydiff-bf16",
    "raydiff-fp16-compile",
    "raydiff-bf16-compile",
    "raydiff-bf16-cudagraphs",
    "raydiff-bf16-channels-last",
    "raydiff-bf16-compile-channels-last",
)
MODES = (*RAYDIFF_MODES, "ref-fp16")


def require_cuda(
    what: str = "bench/gpu_step.py measures a training step",
    how: str = "make bench-gpu",
) -> torch.device:
    """The GPU, or exit with status 2 saying why there is none (``what`` the script measures,
    ``how`` to run it on a GPU machine)."""
    if not torch.cuda.is_available():
        sys.stderr.write(
            f"{what} on a CUDA GPU, and this machine has none "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}: "
            f"torch.cuda.is_available() is False). Run it on a GPU machine: {how}\n"
        )
        raise SystemExit(2)
    return torch.device("cuda", torch.cuda.current_device())


def add_reference_arguments(parser: argparse.ArgumentParser, *, cache_help: str) -> None:
    """The options both GPU benchmarks take: improved-diffusion's checkout, raydiff alone, and
    inductor's cache folder."""
    parser.add_argument(
        "--reference-root",
        type=Path,
        default=REPO / ".reference",
        help="folder holding improved-diffusion/ (default: .reference)",
    )
    parser.add_argument(
        "--no-reference", action="store_true", help="raydiff's modes only (no ref-* mode)"
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help=cache_help)


def use_inductor_cache(folder: Path | None, *, prefix: str) -> Path:
    """Inductor's cache folder for this process: ``folder``, else a fresh one (compiled modes
    then compile cold)."""
    cache = folder or Path(tempfile.mkdtemp(prefix=prefix))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    return cache


def mode_config(preset: str, mode: str, *, batch: int) -> ExperimentConfig:
    """``preset`` trained by one process as ``mode`` says (its precision; ``-compile``:
    ``train.compile=true``; the CUDA-graph and channels-last variants are set up by
    :func:`raydiff_step`)."""
    precision = "bf16" if "-bf16" in mode else "fp16"
    compiled = mode.endswith("-compile") or "-compile-" in mode
    return apply_overrides(
        load_config(preset),
        [
            f"train.batch_size={batch}",
            "train.microbatch=-1",
            f"train.precision={precision}",
            f"train.compile={'true' if compiled else 'false'}",
            "scaling.num_workers=1",
            "scaling.use_gpu=true",
        ],
    )


def random_batch(config: ExperimentConfig, *, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images in [-1, 1] of the config's shape and class labels (pinned, on the CPU)."""
    model = config.model
    g = torch.Generator().manual_seed(0)
    shape = (batch, model.in_channels, model.image_size, model.image_size)
    images = torch.rand(shape, generator=g).mul_(2).sub_(1)
    labels = torch.randint(0, max(model.num_classes, 1), (batch,), generator=g)
    return images.pin_memory(), labels.pin_memory()


def raydiff_step(
    config: ExperimentConfig,
    mode: str,
    data: tuple[torch.Tensor, torch.Tensor],
    device: torch.device,
) -> Callable:
    """raydiff's training step for ``config`` on ``device``, in ``mode``'s variant."""
    from raydiff.train.build import build_rank_optimizer
    from raydiff.train.data_position import DataPosition
    from raydiff.train.local import LocalRuntime
    from raydiff.train.tasks import task_of_config

    images, labels = data
    runtime = LocalRuntime(
        config,
        output_dir=Path(tempfile.mkdtemp(prefix="gpu_step-")),
        resume=None,
        images=images,
        labels=labels if config.model.class_cond else None,
        device=device,
    )
    _, trainer = build_rank_optimizer(config, runtime=runtime, make_task=task_of_config)
    trainer.raw_model.train()
    # One batch as the runtime hands it to the loop (on the device, flipped as configured),
    # reused for every step: a step's cost does not depend on the pixels.
    _, batch = next(
        runtime.train_batches(batch_size=config.train.batch_size, position=DataPosition())
    )
    if mode.endswith("-channels-last"):
        trainer.raw_model.to(memory_format=torch.channels_last)
        batch["x"] = batch["x"].contiguous(memory_format=torch.channels_last)
    if mode.endswith("-cudagraphs"):
        trainer.model = torch.compile(trainer.raw_model, dynamic=False, mode="reduce-overhead")

        def step() -> Any:
            torch.compiler.cudagraph_mark_step_begin()
            return trainer.optimize(batch)

        return step
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


def reference_flags(ref: types.SimpleNamespace, config: ExperimentConfig) -> dict[str, Any]:
    """improved-diffusion's ``create_model_and_diffusion`` arguments for ``config``'s model and
    diffusion."""
    flags = ref.script_util.model_and_diffusion_defaults()
    for name in flags:  # raydiff's model and diffusion fields carry improved-diffusion's names
        section = config.model if hasattr(config.model, name) else config.diffusion
        if not hasattr(section, name):
            raise SystemExit(f"improved-diffusion's flag {name} has no raydiff config field")
        flags[name] = getattr(section, name)
    return flags


def reference_step(
    ref: types.SimpleNamespace, config: ExperimentConfig, data: tuple[torch.Tensor, torch.Tensor]
) -> Callable:
    """improved-diffusion's ``--use_fp16`` training step for the preset's model and diffusion."""
    import torch.distributed as dist

    if not dist.is_initialized():  # TrainLoop wraps the model in DDP on CUDA: one rank of one
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    ref.logger.configure(dir=tempfile.mkdtemp(prefix="gpu_step-ref-"), format_strs=[])
    torch.manual_seed(0)
    model, diffusion = ref.script_util.create_model_and_diffusion(**reference_flags(ref, config))
    model.to(ref.dist_util.dev())
    images, labels = data
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
    cond = {"y": labels} if config.model.class_cond else {}
    return lambda: loop.run_step(images, cond)


def timed(step: Callable, *, batch: int) -> tuple[float, float]:
    """Seconds of one step, from an idle GPU to an idle GPU, and the bytes per image the
    allocator held at its peak above what it held before the step."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return seconds, (torch.cuda.max_memory_allocated() - before) / batch


def noise_draws(config: ExperimentConfig, *, batch: int, device: torch.device) -> dict[str, float]:
    """Median milliseconds of one step's q_sample noise for ``batch`` rows on ``device``: as
    the step draws it (every row's keyed stream in one vectorised draw,
    ``raydiff.core.keyed_noise``) and as a generator per row would (a seeding and a ``randn``
    launch per row: raydiff's draw before the keyed streams)."""
    from raydiff.core.keyed_noise import RowNoise
    from raydiff.seeding import derive_seed

    model = config.model
    shape = (batch, model.in_channels, model.image_size, model.image_size)
    generator = torch.Generator(device=device)

    def keyed(step: int) -> torch.Tensor:
        prefix = derive_seed(0, "noise", step, bits=64)
        return RowNoise.for_rows(prefix, range(batch), device=device).draw(shape)

    def per_row(step: int) -> torch.Tensor:
        rows = [
            torch.randn(
                shape[1:],
                generator=generator.manual_seed(derive_seed(0, "noise", step, row)),
                device=device,
            )
            for row in range(batch)
        ]
        return torch.stack(rows)

    medians = {}
    for name, draw in (("keyed_ms", keyed), ("per_row_ms", per_row)):
        seconds = [timed(functools.partial(draw, step), batch=batch)[0] for step in range(30)]
        medians[name] = 1e3 * statistics.median(seconds[5:])
    return medians


def build_modes(
    args: argparse.Namespace, preset: str, device: torch.device
) -> tuple[dict[str, Callable], int]:
    """The steps of ``args.modes`` for ``preset`` (a bf16 mode skipped on a GPU without bf16),
    and the batch."""
    batch = args.batch or DEFAULT_BATCH[preset]
    data = random_batch(load_config(preset), batch=batch)
    modes: dict[str, Callable] = {}
    for mode in args.modes:
        if mode == "ref-fp16":
            continue
        if "-bf16" in mode and not torch.cuda.is_bf16_supported():
            print(f"{mode}: skipped, this GPU has no bf16", flush=True)
            continue
        torch.manual_seed(0)
        modes[mode] = raydiff_step(mode_config(preset, mode, batch=batch), mode, data, device)
    if "ref-fp16" in args.modes and not args.no_reference:
        ref = import_improved_diffusion(args.reference_root)
        modes["ref-fp16"] = reference_step(ref, mode_config(preset, "ref-fp16", batch=batch), data)
    return modes, batch


def run(modes: dict[str, Callable], *, steps: int, warmup: int, batch: int) -> dict[str, Any]:
    """Each mode's first step alone (a compiled mode compiles), then round-robin: ``warmup``
    untimed and ``steps`` timed steps of every mode."""
    first = {}
    for mode, step in modes.items():
        first[mode] = timed(step, batch=batch)[0]
        print(f"{mode}: first step {first[mode]:.1f} s", flush=True)
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    memory: dict[str, list[float]] = {mode: [] for mode in modes}
    for round_ in range(warmup + steps):
        for mode, step in modes.items():
            seconds, per_image = timed(step, batch=batch)
            if round_ >= warmup:
                times[mode].append(seconds)
                memory[mode].append(per_image)
        if round_ + 1 == warmup:
            print(f"warm-up done ({warmup} steps per mode)", flush=True)
    return {"first_step_s": first, "step_times_s": times, "peak_bytes_per_image": memory}


def report(measured: dict[str, Any], *, preset: str, batch: int) -> dict[str, Any]:
    times = measured["step_times_s"]
    rows = {
        mode: {
            "median_s": statistics.median(ts),
            "images_per_s": batch / statistics.median(ts),
            "peak_mib_per_image": max(measured["peak_bytes_per_image"][mode]) / 2**20,
            "first_step_s": measured["first_step_s"][mode],
        }
        for mode, ts in times.items()
    }
    ref = rows.get("ref-fp16", {}).get("images_per_s")
    noise = measured["noise_draw"]
    fastest_ms = 1e3 * min(row["median_s"] for row in rows.values())
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(f"{preset}, batch {batch}, {len(next(iter(times.values())))} timed steps per mode")
    print(
        f"{'mode':36s} {'ms/step':>9s} {'images/s':>9s} {'MiB/image':>10s} {'first s':>8s} "
        f"{'vs ref-fp16':>12s}"
    )
    for mode, row in rows.items():
        ratio = f"{row['images_per_s'] / ref:11.2f}x" if ref else f"{'-':>12s}"
        print(
            f"{mode:36s} {1e3 * row['median_s']:9.1f} {row['images_per_s']:9.0f} "
            f"{row['peak_mib_per_image']:10.1f} {row['first_step_s']:8.1f} {ratio}"
        )
    print(
        f"the step's noise draw: {noise['keyed_ms']:.2f} ms keyed and vectorised "
        f"({100 * noise['keyed_ms'] / fastest_ms:.1f}% of the fastest step), "
        f"{noise['per_row_ms']:.2f} ms with a generator per row "
        f"({100 * noise['per_row_ms'] / fastest_ms:.1f}%)"
    )
    return {"preset": preset, "batch": batch, "modes": rows, **measured}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per mode")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per mode first")
    parser.add_argument(
        "--batch",
        type=int,
        default=0,
        help="images per step (default: cifar10_hybrid's 128, 64 for imagenet64_cond)",
    )
    parser.add_argument(
        "--presets",
        type=lambda text: tuple(text.split(",")),
        default=PRESETS,
        help=f"comma-separated (default: {','.join(PRESETS)})",
    )
    parser.add_argument(
        "--modes",
        type=lambda text: tuple(text.split(",")),
        default=MODES,
        help=f"comma-separated, of: {', '.join(MODES)} (default: all)",
    )
    add_reference_arguments(
        parser,
        cache_help="inductor's cache folder (default: a fresh one, so compiled modes compile "
        "cold; the folder of an earlier run: its first steps are a restart's, warm)",
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench/results/gpu_step.json", help="JSON output"
    )
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.batch < 0:
        parser.error("--steps must be >= 1, --warmup and --batch >= 0")
    for name, given, valid in (
        ("--presets", args.presets, PRESETS),
        ("--modes", args.modes, MODES),
    ):
        unknown = [value for value in given if value not in valid]
        if unknown:
            parser.error(f"{name}: {', '.join(unknown)} unknown; valid: {', '.join(valid)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = require_cuda()
    cache = use_inductor_cache(args.cache_dir, prefix="gpu_step-inductor-")
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "driver": _driver_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "inductor_cache": str(cache),
        "presets": [],
    }
    for preset in args.presets:
        modes, batch = build_modes(args, preset, device)
        measured = run(modes, steps=args.steps, warmup=args.warmup, batch=batch)
        measured["noise_draw"] = noise_draws(load_config(preset), batch=batch, device=device)
        results["presets"].append(report(measured, preset=preset, batch=batch))
        del modes
        torch.cuda.empty_cache()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.out}")


def _driver_version() -> str:
    """The NVIDIA driver's version (nvidia-smi), or why it is unknown."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"unknown ({error})"
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 else "unknown"


if __name__ == "__main__":
    main()
