"""Training parity: improved-diffusion's own ``TrainLoop`` against raydiff's single-process loop,
same data, same config, several seeds each; do the two code bases train the same model?

Both sides train one small Fashion-MNIST UNet (32x32x1, 0.88M parameters: num_channels 32,
channel_mult 1,1,2, one res block, attention at 8x8 with 4 heads, scale-shift norm, no dropout;
T = 1000 cosine, eps-MSE with a fixed variance; AdamW lr 2e-3, no weight decay, no warm-up and
no anneal; EMA 0.99; batch 32; fp32; uniform timesteps; no flips) for ``--steps`` steps per seed,
in one CPU process:

* ``ref``: improved-diffusion's ``TrainLoop`` (the ``.reference/improved-diffusion`` checkout,
  imported as bench/gpu_step.py does, with its one-process stand-ins for mpi4py and blobfile, and
  a one-process gloo group for ``dist_util``). Its ``UNetModel`` is built directly with
  ``in_channels = out_channels = 1`` (its ``create_model`` hard-codes 3), its diffusion by its own
  ``script_util.create_gaussian_diffusion`` from the same flags. The bench drives
  ``TrainLoop.run_step(batch, {})`` for exactly ``--steps`` steps (``run_loop`` only stops at
  ``lr_anneal_steps``, which would anneal the lr, and saves through blobfile) and after each step
  calls ``logger.dumpkvs()``, as ``run_loop`` does with ``log_interval=1``: its return value's
  ``loss`` is the step's loss, the mean of ``losses["loss"] * weights`` that ``log_loss_dict``
  logged. Nothing of the reference is patched or wrapped.
* ``raydiff``: raydiff's one training loop (``raydiff.train.loop.TrainingLoop``, what
  ``run_loop`` runs) on a ``LocalRuntime`` with the train split in memory, as
  ``raydiff train --single-process`` runs it. A subclass records each step's loss (the
  importance-weighted batch mean the loop writes as ``train/loss_step``) and its time; the
  loop's reports, final preview (one 2-step DDIM image) and final checkpoint (in a temporary run
  folder) run as usual; its own validation is off (no val split given), the bench measures it.

Same data: the train split of the prepared dataset (``--data-dir``) in memory, and on both sides
the batches of raydiff's in-memory loader (``raydiff.data.in_memory.infinite_batches``, seeded
by the run's seed, no flips): the same images in the same order. Same start: the reference's
UNet is built right after ``torch.manual_seed`` with raydiff's init seed, so both sides start
from the same weights (checked, ``same_initial_weights`` in the JSON). What differs is each
side's own code and its random draws of noise and timesteps (the reference's from torch's and
NumPy's global generators, seeded per run; raydiff's from its per-step streams).

Measured, per side and seed:

* the loss curve: the mean training loss of every window of ``--window`` steps (the last window
  may be shorter); ``final_loss`` is the last window's;
* ``val_bpd``: raydiff's validation estimate of the bound (``raydiff.train.validation
  .estimate_bpd``: ``--eval-images`` val images, ``--eval-timesteps`` stratified timesteps) of
  the final EMA weights, with raydiff's diffusion, one fixed draw of timesteps and noise for
  every model: each side's network is measured by the same code on the same inputs;
* ``fd`` (with ``--features``): the Frechet distance between ``--fd-samples`` DDIM samples
  (``--fd-steps`` steps, raydiff's sampler, the same noise for every model) of the final EMA
  weights and ``--fd-reference`` (default: the dataset's ``--fd-split``), in the features of
  the network in ``--features``, through ``raydiff.evaluate.fid.compute_fid``'s injected
  ``extractor``: the penultimate features of a clean raydiff classifier checkpoint
  (``raydiff train-classifier --config evaluator_demo``; the same extractor as ``raydiff
  evaluate fid --features``). A prepared dataset as reference caches its features in its folder.

Agreement rule, per metric (final_loss, val_bpd, fd, and every loss window): with ``m`` and
``s`` the mean and sample standard deviation over seeds of each side, the sides agree when
``|m_ref - m_raydiff| <= 2 * max(s_ref, s_raydiff)``: the difference of the means lies within
the seed-to-seed spread. With fewer than 2 seeds on a side there is no spread, and no verdict.

The sides run alternately (ref seed 0, raydiff seed 0, ref seed 1, ...), so a machine's drift
hits both; the step time (next batch plus one optimiser step, median) is reported per side. On
2 shared CPU cores (torch 2.13, 2 threads) a step took about 0.6 s in the reference and 0.43 s in
raydiff, so the full run (2 sides x 3 seeds x 2000 steps, then 6 evaluations of 1000 val images
x 20 timesteps) takes about 2 hours.

Command (the JSON of every figure goes to ``--output``, default under bench/results/)::

    python bench/training_parity.py                      # or: make bench-parity
    python bench/training_parity.py --steps 60 --seeds 0,1 --window 20 --train-images 2048 \\
        --eval-images 64 --eval-timesteps 4              # smoke run, about 3 minutes
    python bench/training_parity.py --seeds 2 --output bench/results/parity_seed2.json
    python bench/training_parity.py --merge bench/results/training_parity.json \\
        bench/results/parity_seed2.json --output bench/results/parity_3seeds.json
                                                         # more seeds later, merged
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the pure helpers (table, agreement) import neither torch nor raydiff
    import types

    import torch

    from raydiff.config import ExperimentConfig

REPO = Path(__file__).resolve().parents[1]
SIDES = ("ref", "raydiff")
SPREAD_FACTOR = 2.0
"""The agreement rule's k: |mean_ref - mean_raydiff| <= k * max(sd_ref, sd_raydiff)."""
EVAL_SEED = 0
"""Seed of the one draw of validation timesteps and noise, and of the FD samples' noise."""
VAL_BATCH = 64
REFERENCE_FILES = ("train_util.py", "gaussian_diffusion.py", "unet.py", "nn.py", "resample.py")


# ----------------------------------------------------------------------------------------------
# Pure helpers: window means, spread, the agreement rule, the table.
# ----------------------------------------------------------------------------------------------


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]``: distinct non-negative integers."""
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(
            f"--seeds {text!r}: expected comma-separated integers like 0,1,2"
        ) from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"--seeds {text!r}: expected distinct integers >= 0")
    return seeds


def window_means(values: Sequence[float], window: int) -> list[float]:
    """Means of consecutive windows of ``window`` values (the last one may be shorter)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    return [
        statistics.fmean(values[start : start + window]) for start in range(0, len(values), window)
    ]


def window_ends(num_steps: int, window: int) -> list[int]:
    """The step count at the end of each window of :func:`window_means`."""
    return [min(start + window, num_steps) for start in range(0, num_steps, window)]


def spread(values: Sequence[float]) -> dict[str, float | int | None]:
    """``mean``, ``sd`` (sample standard deviation; None below 2 values or with a non-finite
    one, e.g. a diverged run) and ``n``."""
    numbers = [float(v) for v in values]
    finite = all(math.isfinite(v) for v in numbers)
    return {
        "mean": statistics.fmean(numbers) if numbers else None,
        "sd": statistics.stdev(numbers) if len(numbers) >= 2 and finite else None,
        "n": len(numbers),
    }


def agreement(
    ref: Sequence[float], raydiff: Sequence[float], *, factor: float = SPREAD_FACTOR
) -> dict[str, Any]:
    """The agreement rule for one metric: each side's spread over seeds, the difference of the
    means, the tolerance ``factor * max(sd_ref, sd_raydiff)`` and ``agree`` (None without a
    spread: fewer than 2 seeds on a side, or a non-finite value)."""
    a, b = spread(ref), spread(raydiff)
    out: dict[str, Any] = {"ref": a, "raydiff": b, "diff": None, "tolerance": None, "agree": None}
    if a["mean"] is None or b["mean"] is None:
        return out
    out["diff"] = b["mean"] - a["mean"]
    if a["sd"] is None or b["sd"] is None:
        return out
    out["tolerance"] = factor * max(a["sd"], b["sd"])
    out["agree"] = abs(out["diff"]) <= out["tolerance"]
    return out


def summarize(runs: Sequence[Mapping[str, Any]], metrics: Sequence[str]) -> dict[str, Any]:
    """:func:`agreement` of every metric over the runs (dicts with ``side`` and the metric),
    plus per loss window (``window_losses``) and how many windows agree."""
    by_side = {side: [r for r in runs if r["side"] == side] for side in SIDES}
    summary: dict[str, Any] = {
        name: agreement(*([r[name] for r in by_side[s]] for s in SIDES)) for name in metrics
    }
    curves = [[r["window_losses"] for r in by_side[s]] for s in SIDES]
    num_windows = min((len(c) for side in curves for c in side), default=0)
    windows = [agreement(*([c[i] for c in side] for side in curves)) for i in range(num_windows)]
    verdicts = [w["agree"] for w in windows if w["agree"] is not None]
    summary["loss_windows"] = {
        "windows": windows,
        "agree": sum(verdicts) if verdicts else None,
        "judged": len(verdicts),
    }
    return summary


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _spread_text(s: Mapping[str, Any], digits: int) -> str:
    if s["mean"] is None:
        return "-"
    sd = "-" if s["sd"] is None else f"{s['sd']:.{digits}f}"
    return f"{s['mean']:.{digits}f} +- {sd}"


def _verdict(entry: Mapping[str, Any]) -> str:
    if entry["agree"] is None:
        return "no verdict (needs >= 2 seeds a side)"
    word = "agree" if entry["agree"] else "DIFFER"
    return f"{word}: |diff| {abs(entry['diff']):.4g} vs 2 x max sd {entry['tolerance']:.4g}"


METRIC_DIGITS = {"final_loss": 5, "val_bpd": 4, "fd": 4}


def format_table(runs: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]) -> str:
    """Per side and seed the final window loss, val bpd (and fd), then each side's mean +- sd
    over seeds, the difference of the means and the verdict of the agreement rule."""
    metrics = [m for m in METRIC_DIGITS if m in summary]
    width = 20
    head = f"{'side':8s} {'seed':>4s} " + " ".join(f"{m:>{width}s}" for m in metrics)
    lines = [head, "-" * len(head)]
    for side in SIDES:
        for run in (r for r in runs if r["side"] == side):
            cells = " ".join(f"{_number(run[m], METRIC_DIGITS[m]):>{width}s}" for m in metrics)
            lines.append(f"{side:8s} {run['seed']:>4d} {cells}")
    lines.append("-" * len(head))
    for side in SIDES:
        cells = " ".join(
            f"{_spread_text(summary[m][side], METRIC_DIGITS[m]):>{width}s}" for m in metrics
        )
        lines.append(f"{side:8s} {'all':>4s} {cells}")
    diffs = " ".join(f"{_number(summary[m]['diff'], METRIC_DIGITS[m]):>{width}s}" for m in metrics)
    lines.append(f"{'diff':8s} {'':>4s} {diffs}   (raydiff - ref)")
    lines.append("")
    for m in metrics:
        lines.append(f"{m:>10s}: {_verdict(summary[m])}")
    windows = summary.get("loss_windows")
    if windows and windows["judged"]:
        lines.append(
            f"{'loss curve':>10s}: {windows['agree']}/{windows['judged']} windows agree "
            f"(rule: |mean_ref - mean_raydiff| <= {SPREAD_FACTOR:g} x max(sd_ref, sd_raydiff))"
        )
    return "\n".join(lines)


def format_curve(
    summary: Mapping[str, Any], ends: Sequence[int], *, max_rows: int | None = None
) -> str:
    """The loss curve: per window, each side's mean +- sd over seeds and the verdict."""
    windows = summary["loss_windows"]["windows"]
    rows = list(zip(ends, windows, strict=False))
    if max_rows is not None and len(rows) > max_rows:  # every k-th window and the last
        k = math.ceil(len(rows) / max_rows)
        rows = [row for i, row in enumerate(rows) if i % k == 0 or i == len(rows) - 1]
    lines = [f"{'step':>6s} {'ref loss':>22s} {'raydiff loss':>22s}  verdict"]
    for end, w in rows:
        verdict = "-" if w["agree"] is None else ("agree" if w["agree"] else "DIFFER")
        lines.append(
            f"{end:>6d} {_spread_text(w['ref'], 5):>22s} {_spread_text(w['raydiff'], 5):>22s}"
            f"  {verdict}"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# The bench config and the two training sides.
# ----------------------------------------------------------------------------------------------


def bench_overrides(args: argparse.Namespace, seed: int) -> list[str]:
    """The one config of both sides, as raydiff ``section.field=value`` overrides."""
    return [
        "model.image_size=32",
        "model.in_channels=1",
        "model.num_channels=32",
        "model.channel_mult=1,1,2",
        "model.num_res_blocks=1",
        "model.attention_resolutions=8",
        "model.num_heads=4",
        "model.dropout=0.0",
        "model.use_scale_shift_norm=True",
        "diffusion.diffusion_steps=1000",
        "diffusion.noise_schedule=cosine",
        "diffusion.learn_sigma=False",
        f"optim.lr={args.lr}",
        "optim.weight_decay=0.0",
        "optim.warmup_steps=0",
        "optim.lr_anneal_steps=0",
        "optim.grad_clip=0.0",
        "optim.ema_rate=0.99",
        "optim.adam_betas=0.9,0.999",  # torch's AdamW default, which improved-diffusion uses
        "train.batch_size=32",
        "train.microbatch=-1",
        "train.precision=fp32",
        "train.schedule_sampler=uniform",
        f"train.max_steps={args.steps}",
        f"train.log_interval={args.window}",
        f"train.save_interval={args.steps}",  # one checkpoint, at the end
        "train.eval_interval=0",  # the loop gets no val split: the bench evaluates
        "train.sample_interval=0",
        "train.sample_count=1",  # the loop's final preview: one image, two DDIM steps (one
        "train.sample_steps=2",  # step fails in sampling_diffusion: a 1-step SpacedDiffusion)
        f"train.seed={seed}",
        f"data.data_dir={args.data_dir}",
        "data.random_flip=False",  # improved-diffusion's loader never flips
        "scaling.num_workers=1",
    ]


def bench_config(args: argparse.Namespace, seed: int) -> ExperimentConfig:
    from raydiff.config import ExperimentConfig, apply_overrides

    return apply_overrides(ExperimentConfig(), bench_overrides(args, seed))


@dataclass
class Run:
    """One side's training of one seed."""

    side: str
    seed: int
    step_losses: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    train_seconds: float = float("nan")
    same_initial_weights: bool | None = None
    initial_state: dict[str, Any] = field(default_factory=dict, repr=False)  # weights at step 0
    eval_state: dict[str, Any] = field(default_factory=dict, repr=False)  # final EMA weights
    model: Any = field(default=None, repr=False)  # the side's own network


def data_batches(images: torch.Tensor, config: ExperimentConfig) -> Iterator[dict[str, Any]]:
    """raydiff's in-memory loader as ``run_loop`` on a ``LocalRuntime`` draws it (no flips)."""
    from raydiff.data.in_memory import infinite_batches

    for _, batch in infinite_batches(
        images,
        None,
        batch_size=config.train.batch_size,
        seed=config.data.seed,
        random_flip=config.data.random_flip,
    ):
        yield batch


def progress(run: Run, *, total: int, every: int) -> None:
    step = len(run.step_losses)
    if step % every == 0 or step == total:
        loss = statistics.fmean(run.step_losses[-every:])
        per_step = statistics.median(run.step_seconds[-every:])
        print(
            f"  {run.side:7s} seed {run.seed}  step {step:5d}/{total}  loss {loss:.5f}  "
            f"{per_step:.3f} s/step",
            flush=True,
        )


def train_raydiff(
    config: ExperimentConfig,
    images: torch.Tensor,
    *,
    every: int,
    initial: Mapping[str, torch.Tensor] | None = None,
) -> Run:
    """raydiff's loop on a ``LocalRuntime``, recording every step's loss and time."""
    from raydiff.train.local import LocalRuntime
    from raydiff.train.loop import TrainingLoop
    from raydiff.train.tasks.diffusion import diffusion_task

    run = Run(side="raydiff", seed=config.train.seed)
    total = config.train.max_steps

    class RecordingLoop(TrainingLoop):
        def build(self) -> None:
            super().build()
            if initial is not None:
                state = self.raw_model.state_dict()
                run.same_initial_weights = all(torch_equal(state[k], v) for k, v in initial.items())

        def train_step(self) -> tuple[int, Any]:
            start = time.perf_counter()
            epoch, result = super().train_step()
            run.step_seconds.append(time.perf_counter() - start)
            run.step_losses.append(float((result.losses["loss"] * result.weights).mean()))
            progress(run, total=total, every=every)
            return epoch, result

    with tempfile.TemporaryDirectory(prefix="training_parity-") as folder:
        runtime = LocalRuntime(
            config, output_dir=Path(folder), resume=None, images=images, labels=None, val=None
        )
        loop = RecordingLoop(
            config, runtime=runtime, output_dir=Path(folder), make_task=diffusion_task
        )
        start = time.perf_counter()
        loop.run()
        run.train_seconds = time.perf_counter() - start
    run.eval_state = loop.trainer.eval_weights()
    run.model = loop.raw_model
    return run


def torch_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    import torch

    return bool(torch.equal(a, b))


def import_reference(root: Path) -> types.SimpleNamespace:
    """improved-diffusion from ``root/improved-diffusion`` (bench/gpu_step.py's importer, with its
    mpi4py and blobfile stand-ins), its unet module, and a one-process gloo group."""
    import torch.distributed as dist

    sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/, next to this script
    from gpu_step import import_improved_diffusion

    ref = import_improved_diffusion(root)
    import improved_diffusion.unet as unet

    ref.unet = unet
    if not dist.is_initialized():  # TrainLoop reads the world size and broadcasts the weights
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return ref


def reference_model_and_diffusion(
    ref: types.SimpleNamespace, config: ExperimentConfig
) -> tuple[torch.nn.Module, Any]:
    """improved-diffusion's UNetModel (1 channel in and out) and its own diffusion."""
    m, d = config.model, config.diffusion
    model = ref.unet.UNetModel(
        in_channels=m.in_channels,
        model_channels=m.num_channels,
        out_channels=m.in_channels * (2 if d.learn_sigma else 1),
        num_res_blocks=m.num_res_blocks,
        attention_resolutions=m.attention_downsample_rates(),
        dropout=m.dropout,
        channel_mult=m.channel_mult_tuple(),
        num_classes=None,
        use_checkpoint=m.use_checkpoint,
        num_heads=m.num_heads,
        num_heads_upsample=m.num_heads_upsample,
        use_scale_shift_norm=m.use_scale_shift_norm,
    )
    diffusion = ref.script_util.create_gaussian_diffusion(
        steps=d.diffusion_steps,
        learn_sigma=d.learn_sigma,
        sigma_small=d.sigma_small,
        noise_schedule=d.noise_schedule,
        use_kl=d.use_kl,
        predict_xstart=d.predict_xstart,
        rescale_timesteps=d.rescale_timesteps,
        rescale_learned_sigmas=d.rescale_learned_sigmas,
        timestep_respacing=d.timestep_respacing,
    )
    return model, diffusion


def train_reference(
    ref: types.SimpleNamespace, config: ExperimentConfig, images: torch.Tensor, *, every: int
) -> Run:
    """improved-diffusion's TrainLoop, ``run_step`` for exactly ``train.max_steps`` steps."""
    import numpy as np
    import torch

    from raydiff.seeding import derive_seed

    run = Run(side="ref", seed=config.train.seed)
    total = config.train.max_steps
    torch.manual_seed(derive_seed(config.train.seed, "init"))  # raydiff's init: same weights
    model, diffusion = reference_model_and_diffusion(ref, config)
    model.to(ref.dist_util.dev())
    with tempfile.TemporaryDirectory(prefix="training_parity-ref-") as folder:
        ref.logger.configure(dir=folder, format_strs=[])
        loop = ref.train_util.TrainLoop(
            model=model,
            diffusion=diffusion,
            data=None,  # run_step is given each batch
            batch_size=config.train.batch_size,
            microbatch=config.train.microbatch,
            lr=config.optim.lr,
            ema_rate=config.optim.ema_rate,
            log_interval=1,
            save_interval=10**9,
            resume_checkpoint="",
            use_fp16=False,
            schedule_sampler=ref.resample.create_named_schedule_sampler(
                config.train.schedule_sampler, diffusion
            ),
            weight_decay=config.optim.weight_decay,
            lr_anneal_steps=config.optim.lr_anneal_steps,
        )
        run.model = model
        initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
        # The reference draws noise from torch's global generator, timesteps from NumPy's.
        torch.manual_seed(derive_seed(config.train.seed, "reference-steps"))
        np.random.seed(derive_seed(config.train.seed, "reference-steps", bits=32))
        batches = data_batches(images, config)
        start = time.perf_counter()
        for _ in range(total):
            step_start = time.perf_counter()
            batch = next(batches)
            loop.run_step(batch["x"], {})
            logged = ref.logger.dumpkvs()  # what run_loop does every log_interval (here 1)
            loop.step += 1
            run.step_seconds.append(time.perf_counter() - step_start)
            run.step_losses.append(float(logged["loss"]))
            progress(run, total=total, every=every)
        run.train_seconds = time.perf_counter() - start
    run.eval_state = loop._master_params_to_state_dict(loop.ema_params[0])
    run.eval_state = {k: v.detach().clone() for k, v in run.eval_state.items()}
    run.initial_state = initial
    return run


# ----------------------------------------------------------------------------------------------
# Measuring the final EMA weights the same way on both sides.
# ----------------------------------------------------------------------------------------------


@dataclass
class Evaluation:
    """What every model is measured with: raydiff's diffusion, the val images, one draw."""

    diffusion: Any
    batches: list[tuple[torch.Tensor, dict[str, torch.Tensor]]]
    timesteps: Any
    image_shape: tuple[int, int, int]
    extractor: Any = None
    fd_reference: str = ""
    fd_dir: Path | None = None


def make_evaluation(args: argparse.Namespace, config: ExperimentConfig) -> Evaluation:
    from raydiff.data.in_memory import load_split_tensors
    from raydiff.factory import create_gaussian_diffusion
    from raydiff.seeding import derive_seed
    from raydiff.train.validation import stratified_timesteps

    diffusion = create_gaussian_diffusion(config.diffusion)
    images, _, _ = load_split_tensors(args.data_dir, args.val_split, limit=args.eval_images)
    batches = [(images[i : i + VAL_BATCH], {}) for i in range(0, len(images), VAL_BATCH)]
    timesteps = stratified_timesteps(
        diffusion.num_timesteps, args.eval_timesteps, seed=derive_seed(EVAL_SEED, "val-timesteps")
    )
    m = config.model
    return Evaluation(diffusion, batches, timesteps, (m.in_channels, m.image_size, m.image_size))


def evaluate(run: Run, ev: Evaluation, args: argparse.Namespace) -> dict[str, float]:
    """``val_bpd``/``val_mse`` (and ``fd``) of the run's final EMA weights."""
    import torch

    from raydiff.seeding import derive_seed
    from raydiff.train.validation import estimate_bpd, validation_metrics

    start = time.perf_counter()
    model = run.model
    model.load_state_dict(run.eval_state)
    model.eval()
    with torch.no_grad():
        totals = estimate_bpd(
            diffusion=ev.diffusion,
            model=model,
            batches=ev.batches,
            timesteps=ev.timesteps,
            seed=derive_seed(EVAL_SEED, "val-noise"),
        )
    out = validation_metrics(totals)
    if ev.extractor is not None:
        out["fd"] = frechet_distance_of(model, run, ev, args)
    out["eval_seconds"] = time.perf_counter() - start
    return out


def load_feature_extractor(path: Path) -> torch.nn.Module:
    """The ``--features`` network: a clean raydiff classifier checkpoint's penultimate
    features, as ``raydiff evaluate fid --features`` measures."""
    from raydiff.evaluate.classifier_features import load_classifier_features

    return load_classifier_features(path)


def frechet_distance_of(
    model: torch.nn.Module, run: Run, ev: Evaluation, args: argparse.Namespace
) -> float:
    """FD of ``--fd-samples`` DDIM samples of ``model`` against the reference images."""
    import numpy as np
    import torch

    from raydiff.evaluate.fid import compute_fid
    from raydiff.seeding import derive_seed
    from raydiff.train.sample_grid import draw_samples, sampling_diffusion, to_uint8

    assert ev.fd_dir is not None
    sampler = sampling_diffusion(ev.diffusion, steps=args.fd_steps)
    chunks = []
    for index, start in enumerate(range(0, args.fd_samples, args.fd_batch)):
        count = min(args.fd_batch, args.fd_samples - start)
        with torch.no_grad():
            images = draw_samples(
                model=model,
                diffusion=sampler,
                num_samples=count,
                image_shape=ev.image_shape,
                seed=derive_seed(EVAL_SEED, "fd-samples", index),
                num_classes=None,
            )
        chunks.append(to_uint8(images))
    path = ev.fd_dir / f"samples_{run.side}_{run.seed}.npz"
    np.savez(path, arr_0=np.concatenate(chunks))
    result = compute_fid(
        samples=path,
        reference=ev.fd_reference,
        split=args.fd_split,
        num_images=args.fd_samples,
        extractor=ev.extractor,
    )
    return float(result["fid"])


# ----------------------------------------------------------------------------------------------


def reference_hashes(root: Path) -> dict[str, str]:
    """SHA-256 of the reference files that decide its training, to tell checkouts apart."""
    package = root / "improved-diffusion" / "improved_diffusion"
    return {
        name: hashlib.sha256((package / name).read_bytes()).hexdigest()
        for name in REFERENCE_FILES
        if (package / name).is_file()
    }


def run_record(run: Run, metrics: Mapping[str, float], window: int) -> dict[str, Any]:
    record: dict[str, Any] = {
        "side": run.side,
        "seed": run.seed,
        "same_initial_weights": run.same_initial_weights,
        "train_seconds": run.train_seconds,
    }
    record["window_losses"] = window_means(run.step_losses, window)
    record["final_loss"] = record["window_losses"][-1]
    record["median_step_s"] = statistics.median(run.step_seconds)
    record.update(metrics)
    record["step_losses"] = run.step_losses
    record["step_seconds"] = run.step_seconds
    return record


def train_both(
    args: argparse.Namespace, ref: types.SimpleNamespace, images: torch.Tensor, ev: Evaluation
) -> list[dict[str, Any]]:
    """For every seed: the reference, then raydiff, each evaluated at once (alternating)."""
    records = []
    for seed in args.seed_list:
        config = bench_config(args, seed)
        print(f"seed {seed}: improved-diffusion TrainLoop", flush=True)
        ref_run = train_reference(ref, config, images, every=args.window)
        ref_metrics = evaluate(ref_run, ev, args)
        print(f"seed {seed}: raydiff TrainingLoop (LocalRuntime)", flush=True)
        ray_run = train_raydiff(config, images, every=args.window, initial=ref_run.initial_state)
        ref_run.same_initial_weights = ray_run.same_initial_weights
        records.append(run_record(ref_run, ref_metrics, args.window))
        records.append(run_record(ray_run, evaluate(ray_run, ev, args), args.window))
        for r in records[-2:]:
            fd = f", fd {r['fd']:.3f}" if "fd" in r else ""
            print(
                f"  {r['side']:7s} seed {seed}: final loss {r['final_loss']:.5f}, "
                f"val_bpd {r['val_bpd']:.4f}{fd}, {r['median_step_s']:.3f} s/step",
                flush=True,
            )
    return records


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="training steps per run")
    parser.add_argument("--seeds", default="0,1,2", help="seeds, comma-separated (default 0,1,2)")
    parser.add_argument("--window", type=int, default=100, help="steps per loss window")
    parser.add_argument("--lr", type=float, default=2e-3, help="AdamW lr (both sides)")
    parser.add_argument("--data-dir", default=str(REPO / "data" / "fashion-mnist"))
    parser.add_argument(
        "--train-images", type=int, default=None, help="first N train images only (default all)"
    )
    parser.add_argument("--val-split", default="val", help="split of the val_bpd estimate")
    parser.add_argument("--eval-images", type=int, default=1000, help="images of val_bpd")
    parser.add_argument("--eval-timesteps", type=int, default=20, help="timesteps of val_bpd")
    parser.add_argument(
        "--features",
        type=Path,
        default=None,
        metavar="CHECKPOINT",
        help="a clean raydiff classifier checkpoint (evaluator_demo's): also report FD in its "
        "features",
    )
    parser.add_argument("--fd-samples", type=int, default=1000, help="samples per model for FD")
    parser.add_argument("--fd-steps", type=int, default=50, help="DDIM steps of the FD samples")
    parser.add_argument("--fd-batch", type=int, default=250, help="samples per sampling batch")
    parser.add_argument("--fd-split", default="test", help="dataset split FD compares against")
    parser.add_argument(
        "--fd-reference", default=None, help="FD reference images (default: --data-dir)"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="train nothing: merge the results of earlier runs that differ only in their seeds "
        "(e.g. --seeds 0,1 and --seeds 2) into --output, and print the tables",
    )
    parser.add_argument("--reference-root", type=Path, default=REPO / ".reference")
    parser.add_argument(
        "--output", type=Path, default=REPO / "bench" / "results" / "training_parity.json"
    )
    args = parser.parse_args(argv)
    try:
        args.seed_list = parse_seeds(args.seeds)
    except ValueError as error:
        parser.error(str(error))
    for name in ("steps", "window", "eval_images", "eval_timesteps", "fd_samples", "fd_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.fd_batch < 1 or args.threads < 0:
        parser.error("--fd-batch must be >= 1 and --threads >= 0")
    return args


def merge_results(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One result of several runs of the bench (e.g. ``--seeds 0,1`` then ``--seeds 2``): their
    runs together, the agreement summary computed again over all of them. Refused (ValueError)
    when the runs differ in anything but the seed (the config, steps, evaluation or reference
    code) or a (side, seed) appears twice."""
    if not results:
        raise ValueError("nothing to merge")

    def setup(result: Mapping[str, Any]) -> dict[str, Any]:
        """Everything of a result that is not about its seeds, flattened: ``config.data.seed``
        and ``config.train.seed`` follow the run's seed, the arguments name the seeds."""
        flat = {
            f"config.{section}.{k}": v
            for section, fields in result["config"].items()
            for k, v in fields.items()
            if k != "seed"
        }
        seed_args = ("seeds", "seed_list", "output", "merge")
        flat.update({f"args.{k}": v for k, v in result["args"].items() if k not in seed_args})
        flat.update(reference_sha256=result["reference_sha256"], window_ends=result["window_ends"])
        return flat

    first = setup(results[0])
    for other in results[1:]:
        theirs = setup(other)
        differing = sorted(k for k in first.keys() | theirs.keys() if first.get(k) != theirs.get(k))
        if differing:
            raise ValueError(
                f"the results differ in more than their seeds ({', '.join(differing)}): "
                "not one experiment"
            )
    runs = [run for result in results for run in result["runs"]]
    keys = [(run["side"], run["seed"]) for run in runs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"a side and seed appear twice: {sorted(keys)}")
    metrics = [m for m in ("final_loss", "val_bpd", "fd") if all(m in run for run in runs)]
    return {**results[0], "runs": runs, "summary": summarize(runs, metrics)}


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.merge:
        merged = merge_results([json.loads(Path(f).read_text()) for f in args.merge])
        ends = merged["window_ends"]
        print("loss per window\n" + format_curve(merged["summary"], ends, max_rows=20))
        print("\n" + format_table(merged["runs"], merged["summary"]))
        args.output.write_text(json.dumps(merged, indent=1) + "\n")
        print(f"\nwrote {args.output}")
        return
    sys.path.insert(0, str(REPO))  # raydiff from this checkout
    import torch
    import torch.distributed

    from raydiff.config import to_dict
    from raydiff.data.in_memory import load_split_tensors

    if args.threads:
        torch.set_num_threads(args.threads)
    ref = import_reference(args.reference_root)
    config = bench_config(args, args.seed_list[0])
    images, _, _ = load_split_tensors(
        args.data_dir, config.data.train_split, limit=args.train_images
    )
    ev = make_evaluation(args, config)
    with tempfile.TemporaryDirectory(prefix="training_parity-fd-") as fd_dir:
        if args.features is not None:
            ev.extractor = load_feature_extractor(args.features)
            ev.fd_reference, ev.fd_dir = args.fd_reference or args.data_dir, Path(fd_dir)
        print(
            f"{len(images)} train images, {sum(len(b[0]) for b in ev.batches)} val images, "
            f"{args.steps} steps x seeds {args.seed_list}, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads",
            flush=True,
        )
        records = train_both(args, ref, images, ev)
    torch.distributed.destroy_process_group()  # the reference's one-process gloo group
    metrics = ["final_loss", "val_bpd"] + (["fd"] if args.features is not None else [])
    summary = summarize(records, metrics)
    ends = window_ends(args.steps, args.window)
    print("\nloss per window (mean +- sd over seeds)\n" + format_curve(summary, ends, max_rows=20))
    print("\n" + format_table(records, summary))
    for side in SIDES:
        times = [r["median_step_s"] for r in records if r["side"] == side]
        print(f"{side}: median {statistics.median(times):.3f} s/step")
    result = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "rule": f"|mean_ref - mean_raydiff| <= {SPREAD_FACTOR:g} * max(sd_ref, sd_raydiff)",
        "config": to_dict(config),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "reference_sha256": reference_hashes(args.reference_root),
        "window_ends": ends,
        "runs": records,
        "summary": summary,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
