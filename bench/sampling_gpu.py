"""Samples/s of DDIM-50 and 250-step ancestral sampling on one CUDA GPU, in one process:
raydiff's sampler (``raydiff.sample.generate.generate``, eager or compiled, fp32 or autocast)
against improved-diffusion's ``ddim_sample_loop`` / ``p_sample_loop``, same model, same weights,
same batch. Run as ``python bench/sampling.py --gpu`` (``make bench-sampling-gpu``); without
``--gpu``, bench/sampling.py is the Ray benchmark of ``raydiff sample`` on the CPU.

The model and diffusion are the preset's (``--preset``, default configs/cifar10_hybrid.yaml: the
52.5M-parameter 32x32 L_hybrid model, 4000 cosine steps, learned sigmas), the diffusion respaced
to ``ddim50`` for DDIM (eta 0) and to ``250`` for ancestral sampling, both clipping the predicted
x_0 (``clip_denoised``, both sides' default). The weights are improved-diffusion's seeded
initialisation with small seeded noise added to every tensor (its zero-initialised output layers
would make both models predict zeros); raydiff loads them through
``raydiff.train.checkpoint.load_model_weights``, as it loads a published .pt. Before timing, both
fp32 models run one forward pass on the same input and the largest difference is reported (a
check that the two sides sample the same network).

Modes (``--modes``):

* ref-fp32: improved-diffusion's loop and model as its ``image_sample.py`` script runs them
  (``model.eval()``, the loop's own ``th.randn`` noise on the device, then its conversion to uint8
  and the copy to the host).
* ref-fp16: the same after ``model.convert_to_fp16()`` (its torso in half precision, input and
  output layers in fp32). This checkout's ``image_sample.py`` has no ``--use_fp16`` (only its
  training scripts do; guided-diffusion's ``image_sample.py --use_fp16 True`` calls exactly this
  method before sampling), so this mode is what its ``UNetModel.convert_to_fp16`` allows.
* raydiff-fp32 / raydiff-fp32-compile: ``generate`` as ``raydiff sample`` calls it on a GPU
  actor, with the model as loaded or compiled by ``compile_static`` (``--compile``).
* raydiff-bf16 / raydiff-fp16 and their ``-compile`` variants: ``generate(precision=...)`` as
  ``raydiff sample --precision`` runs it: the model's forward pass under ``torch.autocast`` to
  that dtype (outputs cast back to fp32 for the sampler's arithmetic), the fp32 weights kept;
  compiled: the compiled model under autocast. fp16 autocast is skipped on a CPU (refused there).
* raydiff-fp16-weights: the model after ``convert_to_fp16()``, as ``raydiff sample`` runs a
  ``model.use_fp16`` checkpoint on a GPU: the like-for-like counterpart of ref-fp16.

The default modes are ref-fp32, ref-fp16, raydiff-fp32, raydiff-fp32-compile, raydiff-bf16 and
raydiff-bf16-compile (about 3 minutes on an H100 at batch 256, most of it the two compiles and
the fp32 ancestral batches).

Noise: raydiff draws each sample's noise from its own stream keyed by (seed, index), so a sample
does not depend on the batch or the worker count; improved-diffusion draws ``th.randn_like`` for
the whole batch at each step. Both are timed as they are.

Timing: each mode first samples one DDIM batch alone, reported apart as its first batch (a
compiled mode compiles then, cold unless ``--cache-dir`` names inductor's cache of an earlier
run). Then ``--ddim-batches`` DDIM batches and ``--ancestral-batches`` ancestral batches of every
mode, round-robin, each timed between two ``torch.cuda.synchronize()`` calls (the model's input
shapes are the same in both loops, so the DDIM warm-up also warms the ancestral loop). Samples/s:
the batch over the median time of a mode's timed batches. Peak MiB: the most the caching
allocator held during a timed batch above what it held before it (activations and noise; the
weights, resident throughout, are not counted). Prints one table and writes
``bench/results/sampling_gpu.json``.

Without CUDA it says so and exits with status 2; ``--device cpu`` runs the same code on the CPU,
e.g. as a quick check that it works end to end::

    python bench/sampling.py --gpu                                   # on a GPU
    python bench/sampling.py --gpu --device cpu --batch-size 2 --ddim-steps 4 \\
        --ancestral-steps 4 --set model.num_channels=32 --set model.num_res_blocks=1
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
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

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO), str(BENCH)]  # raydiff from this checkout; gpu_step beside this file

from gpu_step import (  # noqa: E402
    _driver_version,
    add_reference_arguments,
    import_improved_diffusion,
    reference_flags,
    require_cuda,
    use_inductor_cache,
)

from raydiff.config import ExperimentConfig, apply_overrides, load_config  # noqa: E402


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mode:
    """How one mode samples: whose loop, in which precision, compiled or not."""

    side: str
    """``ref`` (improved-diffusion) or ``raydiff``."""
    precision: str = "fp32"
    """raydiff's ``generate(precision=)`` (``raydiff sample --precision``): the forward pass
    autocast to bf16 or fp16, the sampler's arithmetic in fp32."""
    fp16_weights: bool = False
    """The model's ``convert_to_fp16()`` applied (its torso's weights in half precision)."""
    compile: bool = False
    """raydiff's ``compile_static``."""


MODES = {
    "ref-fp32": Mode(side="ref"),
    "ref-fp16": Mode(side="ref", fp16_weights=True),
    "raydiff-fp32": Mode(side="raydiff"),
    "raydiff-fp32-compile": Mode(side="raydiff", compile=True),
    "raydiff-bf16": Mode(side="raydiff", precision="bf16"),
    "raydiff-bf16-compile": Mode(side="raydiff", precision="bf16", compile=True),
    "raydiff-fp16": Mode(side="raydiff", precision="fp16"),
    "raydiff-fp16-compile": Mode(side="raydiff", precision="fp16", compile=True),
    "raydiff-fp16-weights": Mode(side="raydiff", fp16_weights=True),
}
DEFAULT_MODES = (
    "ref-fp32",
    "ref-fp16",
    "raydiff-fp32",
    "raydiff-fp32-compile",
    "raydiff-bf16",
    "raydiff-bf16-compile",
)
DEFAULT_OUT = {
    "cuda": REPO / "bench/results/sampling_gpu.json",
    "cpu": REPO / "bench/results/sampling_gpu_cpu_check.json",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case:
    """One sampling loop: DDIM or ancestral, on ``steps`` respaced steps."""

    use_ddim: bool
    steps: int

    @property
    def name(self) -> str:
        return f"ddim-{self.steps}" if self.use_ddim else f"ancestral-{self.steps}"

    @property
    def respacing(self) -> str:
        """The ``timestep_respacing`` both sides' diffusions are built with."""
        return f"ddim{self.steps}" if self.use_ddim else str(self.steps)


def require_device(name: str) -> torch.device:
    """``cuda`` (the current GPU) or ``cpu``; without CUDA, for ``cuda``, exit with status 2
    saying why."""
    if name == "cpu":
        return torch.device("cpu")
    return require_cuda(
        "bench/sampling.py --gpu measures sampling",
        "make bench-sampling-gpu, or add --device cpu for a small check on the CPU",
    )


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with seeded N(0, 0.02^2) noise added to each floating-point tensor, in eval
    mode."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.add_(0.02 * torch.randn(tensor.shape, generator=generator))
    return model.eval()


def fp32_models(
    args: argparse.Namespace, config: ExperimentConfig, device: torch.device
) -> tuple[dict[str, torch.nn.Module], types.SimpleNamespace | None, dict[str, Any] | None]:
    """``{"ref": improved-diffusion's model, "raydiff": raydiff's}`` holding the same weights on
    ``device`` (without a ref mode: raydiff's alone, its own seeded initialisation perturbed),
    improved-diffusion's modules and its flags for ``config`` (None without a ref mode)."""
    from raydiff.train.tasks import task_spec

    torch.manual_seed(0)
    if not any(MODES[name].side == "ref" for name in args.modes):
        return (
            {"raydiff": perturbed(task_spec(config.train.task).network(config)).to(device)},
            None,
            None,
        )
    ref = import_improved_diffusion(args.reference_root)
    flags = reference_flags(ref, config)
    ref_model = perturbed(ref.script_util.create_model_and_diffusion(**flags)[0])
    models = {"ref": ref_model.to(device)}
    models["raydiff"] = raydiff_model_with(config, ref_model.state_dict(), device)
    return models, ref, flags


def raydiff_model_with(
    config: ExperimentConfig, state: dict[str, torch.Tensor], device: torch.device
) -> torch.nn.Module:
    """raydiff's network of ``config`` holding ``state`` (improved-diffusion's state dict, loaded
    as ``raydiff sample`` loads a published .pt), in eval mode on ``device``."""
    from raydiff.train.checkpoint import load_model_weights
    from raydiff.train.tasks import task_spec

    model = task_spec(config.train.task).network(config)
    with tempfile.TemporaryDirectory(prefix="sampling_gpu-") as folder:
        path = Path(folder) / "model.pt"
        torch.save({k: v.cpu() for k, v in state.items()}, path)
        load_model_weights(model, path)
    return model.eval().to(device)


def same_network_difference(
    ref_model: torch.nn.Module,
    model: torch.nn.Module,
    config: ExperimentConfig,
    device: torch.device,
) -> float:
    """The largest absolute difference between the two fp32 models' outputs on one seeded
    input of 4 images at random timesteps (and classes), TF32 convolutions off for it (the
    check compares the networks, not TF32's rounding; the timed modes keep torch's default)."""
    generator = torch.Generator().manual_seed(2)
    m = config.model
    x = torch.randn((4, m.in_channels, m.image_size, m.image_size), generator=generator)
    t = torch.randint(0, config.diffusion.diffusion_steps, (4,), generator=generator)
    kwargs = {}
    if m.class_cond:
        kwargs["y"] = torch.randint(0, m.num_classes, (4,), generator=generator).to(device)
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.no_grad():
            ours = model(x.to(device), t.to(device), **kwargs)
            theirs = ref_model(x.to(device), t.to(device), **kwargs)
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    return float((ours - theirs).abs().max())


def reference_diffusion(ref: types.SimpleNamespace, flags: dict[str, Any], case: Case) -> Any:
    """improved-diffusion's diffusion of ``flags`` respaced for ``case``."""
    create = ref.script_util.create_gaussian_diffusion
    given = {name: flags[name] for name in inspect.signature(create).parameters if name in flags}
    return create(
        **{**given, "steps": flags["diffusion_steps"], "timestep_respacing": case.respacing}
    )


def reference_sampler(
    model: torch.nn.Module,
    diffusion: Any,
    case: Case,
    *,
    config: ExperimentConfig,
    batch: int,
    device: torch.device,
) -> Callable[[], Any]:
    """One batch of improved-diffusion's ``image_sample.py`` loop: random classes on the device
    (class-conditional models), the sampling loop, the uint8 conversion and the copy to the
    host."""
    m = config.model
    shape = (batch, m.in_channels, m.image_size, m.image_size)
    loop = diffusion.ddim_sample_loop if case.use_ddim else diffusion.p_sample_loop

    def sample() -> Any:
        kwargs = {}
        if m.class_cond:
            kwargs["y"] = torch.randint(0, m.num_classes, (batch,), device=device)
        images = loop(model, shape, clip_denoised=True, model_kwargs=kwargs, device=device)
        images = ((images + 1) * 127.5).clamp(0, 255).to(torch.uint8)
        return images.permute(0, 2, 3, 1).contiguous().cpu().numpy()

    return sample


def raydiff_sampler(
    model: torch.nn.Module,
    diffusion: Any,
    case: Case,
    *,
    config: ExperimentConfig,
    batch: int,
    precision: str = "fp32",
) -> Callable[[], Any]:
    """One batch of ``raydiff sample``'s work: ``generate`` of samples ``0..batch-1``, seed 0
    (the classes drawn from (seed, index) as ``raydiff sample`` draws them), in ``precision``."""
    from raydiff.sample.generate import generate, sample_labels

    m = config.model
    indices = range(batch)
    labels = sample_labels(0, indices, num_classes=m.num_classes) if m.class_cond else None
    return lambda: generate(
        model,
        diffusion,
        indices=indices,
        image_shape=(m.in_channels, m.image_size, m.image_size),
        seed=0,
        use_ddim=case.use_ddim,
        labels=labels,
        precision=precision,
    )


def mode_model(mode: Mode, models: dict[str, torch.nn.Module]) -> torch.nn.Module:
    """The model ``mode`` samples with, made from ``models`` (``ref``, ``raydiff``: the fp32
    ones, shared by the modes that do not change their weights)."""
    from raydiff.train.compilation import compile_static

    model = models[mode.side]
    if mode.fp16_weights:
        model = copy.deepcopy(model)
        model.convert_to_fp16()
    if mode.compile:
        model = compile_static(model)
    return model


def build_samplers(
    args: argparse.Namespace, config: ExperimentConfig, cases: list[Case], device: torch.device
) -> tuple[dict[str, dict[str, Callable[[], Any]]], float | None]:
    """``samplers[mode][case]``: one batch of ``mode`` in ``case`` (a bf16 mode skipped on a GPU
    without bf16), and the two fp32 models' largest difference (None without the reference)."""
    from raydiff.factory import create_gaussian_diffusion

    models, ref, flags = fp32_models(args, config, device)
    difference = None
    if "ref" in models:
        difference = same_network_difference(models["ref"], models["raydiff"], config, device)
    diffusions = {
        "raydiff": {
            case.name: create_gaussian_diffusion(
                dataclasses.replace(config.diffusion, timestep_respacing=case.respacing)
            )
            for case in cases
        },
        "ref": {case.name: reference_diffusion(ref, flags, case) for case in cases if ref},
    }
    makers = {
        "raydiff": raydiff_sampler,
        "ref": lambda *a, precision, **kw: reference_sampler(*a, **kw, device=device),
    }
    samplers = {}
    for name in args.modes:
        mode = MODES[name]
        cuda = device.type == "cuda"
        if mode.precision == "bf16" and cuda and not torch.cuda.is_bf16_supported():
            print(f"{name}: skipped, this GPU has no bf16", flush=True)
            continue
        if mode.precision == "fp16" and not cuda:
            print(f"{name}: skipped, fp16 autocast needs a GPU", flush=True)
            continue
        model = mode_model(mode, models)
        samplers[name] = {
            case.name: makers[mode.side](
                model,
                diffusions[mode.side][case.name],
                case,
                config=config,
                batch=args.batch_size,
                precision=mode.precision,
            )
            for case in cases
        }
    return samplers, difference


def timed(sample: Callable[[], Any], device: torch.device) -> tuple[float, float | None]:
    """Seconds of one batch, from an idle device to an idle device, and on CUDA the MiB the
    allocator held at its peak above what it held before the batch (None on the CPU)."""
    if device.type != "cuda":
        start = time.perf_counter()
        sample()
        return time.perf_counter() - start, None
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    sample()
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    return seconds, (torch.cuda.max_memory_allocated(device) - before) / 2**20


def run(
    samplers: dict[str, dict[str, Callable[[], Any]]],
    cases: list[Case],
    *,
    batches: dict[str, int],
    device: torch.device,
) -> dict[str, Any]:
    """Each mode's first batch of ``cases[0]`` alone (a compiled mode compiles), then
    ``batches[case]`` timed batches of every mode, round-robin, case by case."""
    first = {}
    for mode, by_case in samplers.items():
        first[mode] = timed(by_case[cases[0].name], device)[0]
        print(f"{mode}: first {cases[0].name} batch {first[mode]:.1f} s", flush=True)
    times: dict[str, dict[str, list[float]]] = {mode: {} for mode in samplers}
    peaks: dict[str, dict[str, list[float | None]]] = {mode: {} for mode in samplers}
    for case in cases:
        for _ in range(batches[case.name]):
            for mode, by_case in samplers.items():
                seconds, peak = timed(by_case[case.name], device)
                times[mode].setdefault(case.name, []).append(seconds)
                peaks[mode].setdefault(case.name, []).append(peak)
                print(f"{mode} {case.name}: {seconds:.2f} s", flush=True)
    return {"first_batch_s": first, "batch_times_s": times, "peak_mib": peaks}


def rows_of(measured: dict[str, Any], cases: list[Case], *, batch: int) -> list[dict[str, Any]]:
    """One row per case and mode: median seconds, samples/s, peak MiB, first batch, and the
    samples/s against ref-fp16's and ref-fp32's in the same case."""
    rows = []
    for case in cases:
        speed = {
            mode: batch / statistics.median(by_case[case.name])
            for mode, by_case in measured["batch_times_s"].items()
        }
        for mode, by_case in measured["batch_times_s"].items():
            peaks = [p for p in measured["peak_mib"][mode][case.name] if p is not None]
            rows.append(
                {
                    "case": case.name,
                    "mode": mode,
                    "median_s": statistics.median(by_case[case.name]),
                    "samples_per_s": speed[mode],
                    "peak_mib": max(peaks) if peaks else None,
                    "first_batch_s": measured["first_batch_s"][mode] if case is cases[0] else None,
                    **{
                        f"vs_{ref}": speed[mode] / speed[ref] if ref in speed else None
                        for ref in ("ref-fp16", "ref-fp32")
                    },
                }
            )
    return rows


def print_table(rows: list[dict[str, Any]], *, header: str) -> None:
    """The rows as one table under ``header``, then the fastest raydiff DDIM mode against
    improved-diffusion's."""
    print(f"\n{header}")
    print(
        f"{'case':15s} {'mode':22s} {'s/batch':>8s} {'samples/s':>10s} {'peak MiB':>9s} "
        f"{'first s':>8s} {'vs ref-fp16':>12s} {'vs ref-fp32':>12s}"
    )

    def cell(value: float | None, text: str, width: int) -> str:
        return format(value, text) if value is not None else f"{'-':>{width}s}"

    for r in rows:
        print(
            f"{r['case']:15s} {r['mode']:22s} {r['median_s']:8.2f} {r['samples_per_s']:10.1f} "
            f"{cell(r['peak_mib'], '9.0f', 9)} {cell(r['first_batch_s'], '8.1f', 8)} "
            f"{cell(r['vs_ref-fp16'], '11.2f', 11)}{'x' if r['vs_ref-fp16'] else ''} "
            f"{cell(r['vs_ref-fp32'], '11.2f', 11)}{'x' if r['vs_ref-fp32'] else ''}"
        )
    ddim = [r for r in rows if r["case"].startswith("ddim") and r["mode"].startswith("raydiff")]
    best = max(ddim, key=lambda r: r["samples_per_s"], default=None)
    if best is not None and best["vs_ref-fp16"] is not None:
        print(
            f"fastest raydiff {best['case']}: {best['mode']}, {best['vs_ref-fp16']:.2f}x "
            f"improved-diffusion's ref-fp16 (issue 35's target: 3x)"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/sampling.py --gpu", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--preset", default="cifar10_hybrid", help="model and diffusion")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override of the preset, e.g. model.num_channels=32 (repeatable)",
    )
    parser.add_argument("--batch-size", type=int, default=256, help="samples per batch")
    parser.add_argument("--ddim-steps", type=int, default=50)
    parser.add_argument("--ancestral-steps", type=int, default=250)
    parser.add_argument("--ddim-batches", type=int, default=2, help="timed DDIM batches per mode")
    parser.add_argument(
        "--ancestral-batches",
        type=int,
        default=1,
        help="timed ancestral batches per mode (0: none)",
    )
    parser.add_argument(
        "--modes",
        type=lambda text: tuple(text.split(",")),
        default=DEFAULT_MODES,
        help=f"comma-separated, of: {', '.join(MODES)} (default: {','.join(DEFAULT_MODES)})",
    )
    add_reference_arguments(
        parser,
        cache_help="inductor's cache folder (default: a fresh one: compiled modes compile cold)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON output (default: bench/results/sampling_gpu.json; with --device cpu: "
        "bench/results/sampling_gpu_cpu_check.json)",
    )
    args = parser.parse_args(argv)
    if args.batch_size < 1 or min(args.ddim_steps, args.ancestral_steps) < 2:
        parser.error("--batch-size must be >= 1, --ddim-steps and --ancestral-steps >= 2")
    if args.ddim_batches < 1 or args.ancestral_batches < 0:
        parser.error("--ddim-batches must be >= 1, --ancestral-batches >= 0")
    unknown = [mode for mode in args.modes if mode not in MODES]
    if unknown:
        parser.error(f"--modes: {', '.join(unknown)} unknown; valid: {', '.join(MODES)}")
    if args.no_reference:
        args.modes = tuple(mode for mode in args.modes if MODES[mode].side != "ref")
    if not args.modes:
        parser.error("no mode left to run (--no-reference drops the ref-* modes)")
    args.out = args.out or DEFAULT_OUT[args.device]
    return args


def main(argv: list[str] | None = None) -> None:
    started = time.perf_counter()
    args = parse_args(argv)
    device = require_device(args.device)
    cache = use_inductor_cache(args.cache_dir, prefix="sampling_gpu-inductor-")
    config = apply_overrides(load_config(args.preset), args.set)
    cases = [Case(use_ddim=True, steps=args.ddim_steps)]
    if args.ancestral_batches:
        cases.append(Case(use_ddim=False, steps=args.ancestral_steps))
    samplers, difference = build_samplers(args, config, cases, device)
    if difference is not None:
        print(
            f"raydiff and improved-diffusion fp32 models, one forward pass: {difference:.2e} "
            "largest difference",
            flush=True,
        )
    batches = {cases[0].name: args.ddim_batches}
    if len(cases) > 1:
        batches[cases[1].name] = args.ancestral_batches
    measured = run(samplers, cases, batches=batches, device=device)
    rows = rows_of(measured, cases, batch=args.batch_size)
    print_table(rows, header=describe(device, args=args))
    elapsed = time.perf_counter() - started
    print(f"elapsed {elapsed:.0f} s (all modes and cases, model building included)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                **machine(device),
                "preset": args.preset,
                "overrides": args.set,
                "batch": args.batch_size,
                "inductor_cache": str(cache),
                "fp32_max_abs_difference": difference,
                "elapsed_s": elapsed,
                "rows": rows,
                **measured,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


def machine(device: torch.device) -> dict[str, Any]:
    """The device, driver, torch and CUDA versions."""
    if device.type == "cuda":
        name, driver = torch.cuda.get_device_name(device), _driver_version()
    else:
        name, driver = f"CPU ({torch.get_num_threads()} threads)", None
    return {
        "device": name,
        "driver": driver,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "matmul_precision": torch.get_float32_matmul_precision(),
    }


def describe(device: torch.device, *, args: argparse.Namespace) -> str:
    """The table's header: the machine, the preset, the batch and the loops."""
    m = machine(device)
    overrides = f" ({', '.join(args.set)})" if args.set else ""
    cuda = f", driver {m['driver']}, CUDA {m['cuda']}" if device.type == "cuda" else ""
    return (
        f"{m['device']}, torch {m['torch']}{cuda}\n"
        f"{args.preset}{overrides}: batch {args.batch_size}; {args.ddim_batches} timed "
        f"ddim-{args.ddim_steps} and {args.ancestral_batches} timed "
        f"ancestral-{args.ancestral_steps} batches per mode"
    )


if __name__ == "__main__":
    main()
