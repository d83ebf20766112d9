"""The ``raydiff`` command line: ``raydiff SUBCOMMAND ...`` (same as ``python jobs/SUBCOMMAND.py``).

Each subcommand is a pair of functions registered in ``SUBCOMMANDS``: one adds its arguments to
an ``argparse`` sub-parser, the other turns the parsed arguments into a typed config and calls
one library function. Heavy imports (Ray, torch) happen inside the run functions, so ``raydiff
--help`` and ``raydiff prepare`` start quickly.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raydiff.errors import ConfigError, RunFailedError, RunInterruptedError, UserInputError

if TYPE_CHECKING:
    from raydiff.data.manifest import Manifest
    from raydiff.data.prepare import PrepareOptions

logger = logging.getLogger(__name__)

# Exit codes: 0 success, 1 a user error with a message (bad input, existing output), 2 argparse.
EXIT_USER_ERROR = 1
# A sweep or a training run stopped by Ctrl-C (continue it with --resume / the same command), as
# shells report SIGINT.
EXIT_INTERRUPTED = 130
# A run that failed after its automatic restarts (RunFailedError): running it again continues it.
EXIT_RUN_FAILED = 3


@dataclass(frozen=True)
class Subcommand:
    """One ``raydiff`` subcommand."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# --------------------------------------------------------------------------------------------
# prepare


def add_prepare_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``raydiff prepare`` (and ``python jobs/prepare.py``)."""
    from raydiff.data.encode import FITS
    from raydiff.data.prepare import PrepareOptions
    from raydiff.data.sources import EMBEDDED_SOURCES, LABEL_RULES

    defaults = PrepareOptions(source="-", out="-")
    parser.add_argument(
        "source",
        help="image folder (recursive; jpg jpeg png gif webp bmp), IDX images file or folder, "
        f".npz (arr_0 NHWC uint8, optional arr_1 labels), or one of: {', '.join(EMBEDDED_SOURCES)}",
    )
    parser.add_argument("--out", required=True, help="folder to create (local path)")
    parser.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="side of the stored square images (default: 32 for fashion-mnist, else 64)",
    )
    parser.add_argument(
        "--channels",
        type=int,
        choices=(1, 3),
        default=None,
        help="1 (grey) or 3 (RGB); default: 1 for grey IDX/.npz sources, else 3",
    )
    parser.add_argument(
        "--fit",
        choices=FITS,
        default=defaults.fit,
        help="resize: improved-diffusion's rule (BOX halving, BICUBIC, centre crop); "
        "pad: centre-pad smaller images with black (default: %(default)s)",
    )
    parser.add_argument(
        "--labels",
        choices=LABEL_RULES,
        default=defaults.labels,
        help="prefix: file name before the first '_' (improved-diffusion); folder: first "
        "sub-folder; auto: stored labels of IDX/.npz, none for folders (default: %(default)s)",
    )
    parser.add_argument(
        "--val-count",
        type=int,
        default=defaults.val_count,
        help="images held out of train as the val split, at most 10%% of train "
        "(default: %(default)s; 0 for none)",
    )
    parser.add_argument(
        "--val-fraction",
        type=float,
        default=None,
        help="fraction of train held out as val (overrides --val-count)",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of val and row order")
    parser.add_argument(
        "--max-bad-fraction",
        type=float,
        default=defaults.max_bad_fraction,
        help="fail if more than this fraction of images is unreadable (default: %(default)s)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
    parser.add_argument(
        "--workers",
        type=int,
        default=defaults.num_workers,
        help="encoder processes (default: the number of cores, %(default)s)",
    )
    parser.add_argument(
        "--shard-rows",
        type=int,
        default=defaults.shard_max_rows,
        help="rows per shard at most (default: %(default)s)",
    )
    parser.add_argument(
        "--shard-mb",
        type=float,
        default=defaults.shard_max_bytes / (1 << 20),
        help="MiB of PNG data per shard at most (default: %(default)s)",
    )
    parser.add_argument(
        "--compress-level",
        type=int,
        default=defaults.compress_level,
        help="PNG zlib level 0-9 (default: %(default)s, fast)",
    )
    parser.add_argument(
        "--limit", type=int, default=None, help="keep only the first N images of each split"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no summary")


def run_prepare(args: argparse.Namespace) -> int:
    """Build ``PrepareOptions`` from the arguments and run prepare."""
    from raydiff.data.prepare import prepare_dataset

    # An invalid option raises ConfigError(section="prepare"); main() names its flag.
    options = _prepare_options(args)
    with _terminate_as_exit():
        summary = prepare_dataset(options)
    if not args.quiet:
        print(summary.format())
    return 0


# The command-line flag of each PrepareOptions field that has one.
PREPARE_FLAGS = {
    "source": "SOURCE",
    "out": "--out",
    "image_size": "--image-size",
    "channels": "--channels",
    "fit": "--fit",
    "labels": "--labels",
    "val_count": "--val-count",
    "val_fraction": "--val-fraction",
    "seed": "--seed",
    "max_bad_fraction": "--max-bad-fraction",
    "num_workers": "--workers",
    "shard_max_rows": "--shard-rows",
    "shard_max_bytes": "--shard-mb (in bytes)",
    "compress_level": "--compress-level",
    "limit": "--limit",
}


def _prepare_options(args: argparse.Namespace) -> PrepareOptions:
    from raydiff.data.prepare import PrepareOptions

    return PrepareOptions(
        source=args.source,
        out=args.out,
        image_size=args.image_size,
        channels=args.channels,
        fit=args.fit,
        labels=args.labels,
        val_count=args.val_count,
        val_fraction=args.val_fraction,
        seed=args.seed,
        max_bad_fraction=args.max_bad_fraction,
        overwrite=args.overwrite,
        num_workers=args.workers,
        shard_max_rows=args.shard_rows,
        shard_max_bytes=int(args.shard_mb * (1 << 20)),
        compress_level=args.compress_level,
        limit=args.limit,
        progress=not args.quiet,
    )


# --------------------------------------------------------------------------------------------
# train

DEFAULT_CONFIG = "demo"  # a preset name: raydiff/configs/demo.yaml (configs/demo.yaml)
DEFAULT_DATA = "data/fashion-mnist"


def add_address_argument(parser: argparse.ArgumentParser) -> None:
    """``--address``, the Ray cluster to run on (train, sweep, sample)."""
    parser.add_argument(
        "--address",
        default=None,
        help="Ray cluster to run on: 'auto' (the one `ray start` runs on this machine), "
        "HOST:PORT or ray://HOST:PORT (default: $RAY_ADDRESS, else a new local instance)",
    )


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``raydiff train`` (and ``python jobs/train.py``)."""
    parser.add_argument(
        "--config",
        default=None,
        help="YAML config file, or a preset's name (demo, cifar10_hybrid, cifar10_vlb, "
        "imagenet64_hybrid, imagenet64_cond; configs/NAME.yaml) (default: demo, the "
        "Fashion-MNIST demo)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a config field: section.field=value, or a unique improved-diffusion "
        "flag name (noise_schedule=cosine); repeatable",
    )
    parser.add_argument(
        "--data",
        default=None,
        help="prepared dataset (folder or URI with manifest.json); sets data.data_dir (default: "
        f"the config's data.data_dir; {DEFAULT_DATA}, the demo's, is prepared from "
        "fashion-mnist when missing)",
    )
    parser.add_argument(
        "--output",
        default="runs/demo",
        help="run folder: a local path or a URI pyarrow reads, e.g. s3://bucket/prefix/run (S3 "
        "from the standard AWS_* variables, AWS_ENDPOINT_URL included) (default: %(default)s)",
    )
    parser.add_argument("--max-steps", type=int, default=None, help="sets train.max_steps")
    parser.add_argument(
        "--num-workers", type=int, default=None, help="sets scaling.num_workers (Ray Train workers)"
    )
    parser.add_argument(
        "--single-process",
        action="store_true",
        help="train in this process without Ray (debugging; one worker, in-memory data)",
    )
    parser.add_argument(
        "--resume",
        default=None,
        help="checkpoint folder (or URI) to continue from (default: the newest under --output)",
    )
    parser.add_argument(
        "--evaluate-checkpoints",
        action="store_true",
        help="evaluate every checkpoint on a Ray actor while training goes on (samples, "
        "bits/dim on val images, FID with evaluation.inception); sets "
        "evaluation.every_checkpoint",
    )
    add_address_argument(parser)


def run_train(args: argparse.Namespace) -> int:
    """Build the config, check it, prepare the embedded dataset if needed, and train."""
    from raydiff.config import load_config
    from raydiff.storage import resolve_location
    from raydiff.train.preflight import fit_to_data

    overrides = list(args.overrides)
    if args.max_steps is not None:
        overrides.append(f"train.max_steps={args.max_steps}")
    if args.num_workers is not None:
        overrides.append(f"scaling.num_workers={args.num_workers}")
    if args.data is not None:
        overrides.append(f"data.data_dir={args.data}")
    if args.evaluate_checkpoints:
        overrides.append("evaluation.every_checkpoint=true")
    config = load_config(args.config or DEFAULT_CONFIG, overrides)
    if args.single_process and config.evaluation.every_checkpoint:
        raise UserInputError(
            "evaluation.every_checkpoint needs Ray (an evaluation actor beside the training): "
            "drop --single-process, or evaluate checkpoints afterwards with raydiff evaluate"
        )
    # Everything the config alone decides is checked before any side effect (preparing data).
    # One process trains the whole batch: scaling.num_workers does not apply to it.
    config.train.per_worker_batch(1 if args.single_process else config.scaling.num_workers)
    manifest = manifest_preparing_demo(config.data.data_dir)  # read once for the whole run
    config = fit_to_data(config, manifest, keep_channels=_sets_field(overrides, "in_channels"))
    output = resolve_location(args.output)  # an absolute local path, or a URI (s3://, gs://)
    if args.single_process:
        from raydiff.train.local import run_single_process

        result = run_single_process(
            config,
            output_dir=output,
            resume=args.resume or None,
            manifest=manifest,
        )
    else:
        from raydiff.orchestrate.trainer import run_training_job

        result = run_training_job(
            config,
            output_dir=output,
            resume=args.resume,
            manifest=manifest,
            address=args.address,
        )
    print(f"final metrics: {_format_metrics(result)}")
    if "evaluation" in result:
        evaluation = result["evaluation"]
        print(f"evaluation:    {_format_metrics(evaluation) or evaluation.get('error')}")
    print(f"run folder:    {output}")
    print(f"tensorboard:   tensorboard --logdir {output / 'tensorboard'}")
    return 0


def manifest_preparing_demo(data_dir: str) -> Manifest:
    """The manifest of the dataset at ``data_dir``; the embedded Fashion-MNIST dataset
    (``data/fashion-mnist``) is prepared first when it is missing."""
    from pathlib import Path

    from raydiff.data.manifest import load_manifest

    embedded = "://" not in data_dir and Path(data_dir).resolve() == Path(DEFAULT_DATA).resolve()
    if embedded and not (Path(data_dir) / "manifest.json").is_file():
        from raydiff.data.prepare import PrepareOptions, prepare_dataset

        logger.info("preparing the embedded Fashion-MNIST dataset into %s (once)", data_dir)
        with _terminate_as_exit():
            print(prepare_dataset(PrepareOptions(source="fashion-mnist", out=data_dir)).format())
    return load_manifest(data_dir)


# --------------------------------------------------------------------------------------------
# sweep


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``raydiff sweep`` (and ``python jobs/sweep.py``)."""
    parser.add_argument(
        "--config",
        default=None,
        help="sweep file (YAML: base config, search space, trials, scheduler; e.g. "
        "configs/sweep_demo.yaml, which docs/sweeps.md explains)",
    )
    parser.add_argument("--output", default=None, help="sweep folder (must be new or empty)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a field of the base config for every trial (max_steps=20); repeatable",
    )
    parser.add_argument(
        "--num-workers",
        type=int,
        default=None,
        help="Ray Train workers per trial (sets scaling.num_workers)",
    )
    parser.add_argument(
        "--resume",
        default=None,
        metavar="DIR",
        help="continue the interrupted sweep in DIR (finished trials are not run again)",
    )
    add_address_argument(parser)


def run_sweep(args: argparse.Namespace) -> int:
    """Check the sweep (every trial's config included), run it on Ray Tune, print the results."""
    if args.resume:
        if args.config or args.output or args.overrides or args.num_workers is not None:
            raise UserInputError(
                "--resume DIR continues a sweep as it was started: give it alone (with "
                "--address at most)"
            )
        from raydiff.orchestrate.sweep import resume_sweep

        outcome = resume_sweep(args.resume, address=args.address)
    else:
        if not args.config or not args.output:
            raise UserInputError(
                "give --config SWEEP.yaml and --output DIR (or --resume DIR to continue a sweep)"
            )
        from raydiff.orchestrate.sweep import sweep_folder

        sweep_folder("--output", args.output)  # a URI is refused before the trials are checked
        from raydiff.sweep.spec import load_sweep

        overrides = list(args.overrides)
        if args.num_workers is not None:
            overrides.append(f"scaling.num_workers={args.num_workers}")
        # Checked in full (every trial's config against the data) before Ray starts.
        loaded = load_sweep(args.config, overrides=overrides, manifest_for=manifest_preparing_demo)
        from raydiff.orchestrate.sweep import start_sweep

        outcome = start_sweep(loaded, output_dir=args.output, address=args.address)
    print(outcome.table)
    folder = args.resume or args.output
    if outcome.interrupted:
        print(f"sweep interrupted; continue it with: raydiff sweep --resume {folder}")
        return EXIT_INTERRUPTED
    print(f"results:       {outcome.results_csv}")
    if outcome.best_config:
        print(f"best config:   {outcome.best_config}")
    if outcome.best_checkpoint:
        print(f"best checkpoint: {outcome.best_checkpoint}")
    print(f"tensorboard:   tensorboard --logdir {outcome.tensorboard_dir}")
    return 0


# --------------------------------------------------------------------------------------------
# sample


def add_model_source_arguments(parser: argparse.ArgumentParser) -> None:
    """The model to load: ``--checkpoint`` and its ``--weights``, or a .pt with its flags."""
    parser.add_argument(
        "--checkpoint",
        required=True,
        help="a raydiff checkpoint_NNNNNN folder, or a published improved-/guided-diffusion .pt "
        "(with --model-flags or --config)",
    )
    parser.add_argument(
        "--weights",
        default=None,
        help="raydiff checkpoints: 'model' or 'ema_RATE' (default: the first EMA rate)",
    )
    parser.add_argument(
        "--model-flags",
        default=None,
        help="a .pt's model and diffusion flags in improved-diffusion's syntax, e.g. "
        '"--image_size 64 --num_channels 128 --learn_sigma True"',
    )
    parser.add_argument("--config", default=None, help="or a config file describing a .pt's model")


def add_sample_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``raydiff sample`` (and ``python jobs/sample.py``)."""
    add_model_source_arguments(parser)
    parser.add_argument("--num-samples", type=int, required=True, help="images to generate")
    parser.add_argument(
        "--out", required=True, help="output folder, new or empty: a local path or a URI (s3://...)"
    )
    parser.add_argument(
        "--timestep-respacing",
        default="",
        help="sample on these steps: '250', 'ddim50', '10,15,20' (default: all of the model's)",
    )
    parser.add_argument(
        "--use-ddim", action="store_true", help="DDIM instead of ancestral sampling"
    )
    parser.add_argument("--eta", type=float, default=0.0, help="DDIM eta (default: 0)")
    parser.add_argument(
        "--clip-denoised",
        default=True,
        action=argparse.BooleanOptionalAction,
        help="clip the predicted x_0 to [-1, 1] (default: on)",
    )
    parser.add_argument(
        "--class-labels",
        default="",
        help="class-conditional models: labels used in turn, e.g. '1,5' (default: random per "
        "sample, from the seed)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=16, help="samples per batch (default: 16)"
    )
    parser.add_argument(
        "--num-workers", type=int, default=1, help="Ray sampler actors (default: 1)"
    )
    parser.add_argument("--use-gpu", action="store_true", help="one GPU per worker")
    parser.add_argument(
        "--seed", type=int, default=0, help="sample i depends only on (seed, i) (default: 0)"
    )
    parser.add_argument(
        "--classifier",
        default=None,
        help="classifier guidance: a guided-diffusion classifier .pt (noisy-image classifier)",
    )
    parser.add_argument(
        "--classifier-flags",
        default=None,
        help="its flags in guided-diffusion's syntax, e.g. '--classifier_width 128 "
        "--classifier_depth 2 --classifier_attention_resolutions 32,16,8' (default: "
        "guided-diffusion's defaults; image size and classes follow the model)",
    )
    parser.add_argument(
        "--classifier-scale",
        type=float,
        default=1.0,
        help="guidance scale: multiplies grad log p(y | x_t) (default: 1)",
    )
    add_address_argument(parser)


def run_sample(args: argparse.Namespace) -> int:
    """Check the request (the checkpoint included), sample on Ray, write npz + PNGs + grid."""
    from raydiff.sample.options import SampleOptions

    try:
        labels = tuple(int(c) for c in args.class_labels.split(",") if c.strip())
    except ValueError:
        raise UserInputError(
            f"--class-labels {args.class_labels!r} is invalid: expected integers like '1,5'"
        ) from None
    options = SampleOptions(
        checkpoint=args.checkpoint,
        num_samples=args.num_samples,
        out=args.out,
        weights=args.weights,
        model_flags=args.model_flags,
        config_file=args.config,
        timestep_respacing=args.timestep_respacing,
        use_ddim=args.use_ddim,
        eta=args.eta,
        clip_denoised=args.clip_denoised,
        class_labels=labels,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        use_gpu=args.use_gpu,
        seed=args.seed,
        classifier=args.classifier,
        classifier_flags=args.classifier_flags,
        classifier_scale=args.classifier_scale,
    )
    from raydiff.orchestrate.sampling import run_sampling

    result = run_sampling(options, address=args.address)
    print(
        f"{result.num_samples} samples in {result.seconds:.1f} s "
        f"({result.samples_per_s:.2f} samples/s)"
    )
    print(f"npz:    {result.npz}")
    print(f"images: {result.png_dir}")
    print(f"grid:   {result.grid}")
    return 0


# --------------------------------------------------------------------------------------------
# evaluate


def add_evaluate_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``raydiff evaluate bpd|fid`` (and ``python jobs/evaluate.py``)."""
    metrics = parser.add_subparsers(dest="metric", required=True, metavar="METRIC")
    bpd = metrics.add_parser(
        "bpd",
        help="the full variational bound in bits/dim over a split (calc_bpd_loop on Ray workers)",
        description="The full variational bound (IDDPM eq. 5) in bits/dim, every term of it, "
        "over a split of the dataset, images spread over Ray workers. Results: JSON (printed), "
        "per-image terms (npz), and the run's TensorBoard for a run's checkpoint.",
    )
    add_model_source_arguments(bpd)
    bpd.add_argument(
        "--data", default=None, help="prepared dataset (default: the one the model trained on)"
    )
    bpd.add_argument("--split", default="test", help="split to evaluate (default: test)")
    bpd.add_argument(
        "--num-images",
        type=int,
        default=None,
        help="evaluate the split's first N images (default: all; each image costs T model calls)",
    )
    bpd.add_argument(
        "--timestep-respacing",
        default="",
        help="the bound of a respaced chain, e.g. '100' (cheaper, looser; default: all steps)",
    )
    bpd.add_argument(
        "--clip-denoised",
        default=True,
        action=argparse.BooleanOptionalAction,
        help="clip the predicted x_0 to [-1, 1] (default: on, as improved-diffusion)",
    )
    bpd.add_argument("--batch-size", type=int, default=32, help="images per batch (default: 32)")
    bpd.add_argument("--num-workers", type=int, default=1, help="Ray actors (default: 1)")
    bpd.add_argument("--use-gpu", action="store_true", help="one GPU per worker")
    bpd.add_argument(
        "--seed", type=int, default=0, help="image i's noise depends only on (seed, i)"
    )
    bpd.add_argument(
        "--out",
        default=None,
        help="results folder, a local path or a URI (default: RUN/evaluation/checkpoint_NNNNNN "
        "for a run's checkpoint)",
    )
    add_address_argument(bpd)

    fid = metrics.add_parser(
        "fid",
        help="FID and KID of samples against a reference (Inception weights from a local file)",
        description="FID and KID between samples (a `raydiff sample` folder or npz, or an image "
        "folder) and a reference (a prepared dataset's split, an npz or an image folder), with "
        "the standard FID Inception network (torch-fidelity's) read from a local weights file. "
        "A prepared dataset's reference features are cached next to it.",
    )
    fid.add_argument(
        "--samples",
        required=True,
        help="a `raydiff sample --out` folder, an npz or image folder (a local path or a URI)",
    )
    fid.add_argument(
        "--reference",
        default=None,
        help="a prepared dataset (its --split), an npz or an image folder (default: the dataset "
        "the samples' model trained on, for a `raydiff sample` folder)",
    )
    fid.add_argument(
        "--split", default="test", help="the reference dataset's split (default: test)"
    )
    fid.add_argument(
        "--inception",
        default=None,
        help="the FID Inception weights file (default: $RAYDIFF_INCEPTION, else "
        "~/.cache/raydiff/weights-inception-2015-12-05-6726825d.pth)",
    )
    fid.add_argument(
        "--num-images", type=int, default=None, help="use at most N images of each side"
    )
    fid.add_argument("--batch-size", type=int, default=64, help="Inception batch (default: 64)")
    fid.add_argument(
        "--out", default=None, help="results JSON, a path or a URI (default: beside the samples)"
    )


def run_evaluate(args: argparse.Namespace) -> int:
    """``raydiff evaluate bpd`` / ``fid``: compute, print the JSON, say where it went."""
    import json

    if args.metric == "bpd":
        from raydiff.evaluate.options import BpdOptions

        options = BpdOptions(
            checkpoint=args.checkpoint,
            weights=args.weights,
            model_flags=args.model_flags,
            config_file=args.config,
            data=args.data,
            split=args.split,
            num_images=args.num_images,
            timestep_respacing=args.timestep_respacing,
            clip_denoised=args.clip_denoised,
            batch_size=args.batch_size,
            num_workers=args.num_workers,
            use_gpu=args.use_gpu,
            seed=args.seed,
            out=args.out,
        )
        from raydiff.orchestrate.evaluation import run_bpd

        result = run_bpd(options, address=args.address)
        print(json.dumps(result.summary, indent=2))
        summary = result.summary
        print(
            f"{summary['split']}: {summary['bpd']:.4f} +- {summary['bpd_stderr']:.4f} bits/dim "
            f"({summary['num_images']} images, {result.seconds:.0f} s)"
        )
        print(f"results: {result.json_path}")
        print(f"terms:   {result.terms_path}")
        if result.tensorboard_run is not None:
            print(f"tensorboard: tensorboard --logdir {result.tensorboard_run / 'tensorboard'}")
        return 0
    if args.metric == "fid":
        from raydiff.orchestrate.evaluation import run_fid

        result = run_fid(
            samples=args.samples,
            reference=args.reference,
            split=args.split,
            inception=args.inception,
            num_images=args.num_images,
            batch_size=args.batch_size,
            out=args.out,
        )
        print(json.dumps(result.summary, indent=2))
        print(f"results: {result.json_path}")
        if result.tensorboard_run is not None:
            print(f"tensorboard: tensorboard --logdir {result.tensorboard_run / 'tensorboard'}")
        return 0
    raise AssertionError(f"unknown metric {args.metric}")


def _sets_field(overrides: list[str], name: str) -> bool:
    """Whether a ``--set`` override names field ``name`` (bare or as section.field)."""
    return any(item.partition("=")[0].strip().rpartition(".")[2] == name for item in overrides)


def _format_metrics(metrics: dict[str, Any]) -> str:
    keys = ("step", "loss", "val_bpd", "val_mse", "images_per_s", "bpd_val", "fid", "kid_mean")
    return "  ".join(
        f"{k} {metrics[k]:.4g}" if isinstance(metrics[k], float) else f"{k} {metrics[k]}"
        for k in keys
        if k in metrics
    )


# --------------------------------------------------------------------------------------------
# registry and entry point

SUBCOMMANDS: dict[str, Subcommand] = {
    "prepare": Subcommand(
        help="turn an image collection into Parquet shards + manifest.json",
        add_arguments=add_prepare_arguments,
        run=run_prepare,
    ),
    "train": Subcommand(
        help="train a diffusion model (default: the Fashion-MNIST demo)",
        add_arguments=add_train_arguments,
        run=run_train,
    ),
    "sample": Subcommand(
        help="generate samples from a checkpoint on Ray workers (npz + PNGs + grid)",
        add_arguments=add_sample_arguments,
        run=run_sample,
    ),
    "evaluate": Subcommand(
        help="evaluate a checkpoint: bits/dim over a split, FID/KID of samples",
        add_arguments=add_evaluate_arguments,
        run=run_evaluate,
    ),
    "sweep": Subcommand(
        help="sweep config fields with Ray Tune (one Ray Train run per trial, ASHA stopping)",
        add_arguments=add_sweep_arguments,
        run=run_sweep,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per entry of ``SUBCOMMANDS``."""
    parser = argparse.ArgumentParser(
        prog="raydiff", description="Diffusion models (IDDPM / ADM) on Ray."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, subcommand in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=subcommand.help, description=subcommand.help)
        subcommand.add_arguments(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point (``raydiff = raydiff.cli:main``); returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG
        if args.verbose
        else logging.WARNING
        if getattr(args, "quiet", False)
        else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return SUBCOMMANDS[args.command].run(args)
    except (UserInputError, FileNotFoundError, FileExistsError) as error:
        # User mistakes get one clear line, not a traceback (use -v for the traceback). Anything
        # else (a plain ValueError from torch included) is a bug and keeps its traceback.
        logger.debug("details", exc_info=True)
        message = render_error(error, args)
        print(f"raydiff {args.command}: error: {message}", file=sys.stderr)
        return EXIT_USER_ERROR
    except RunFailedError as error:
        # Not the user's mistake, but their next step is in the message (Ray's error: -v).
        logger.debug("details", exc_info=True)
        print(f"raydiff {args.command}: error: {error}", file=sys.stderr)
        return EXIT_RUN_FAILED
    except RunInterruptedError as error:
        print(f"raydiff {args.command}: {error}", file=sys.stderr)
        return EXIT_INTERRUPTED


# Flags of `raydiff train` that set a config field: (section, field) -> (flag, argparse dest).
TRAIN_FLAGS = {
    ("train", "max_steps"): ("--max-steps", "max_steps"),
    ("scaling", "num_workers"): ("--num-workers", "num_workers"),
    ("data", "data_dir"): ("--data", "data"),
}


def render_error(error: Exception, args: argparse.Namespace) -> str:
    """The message of a user's mistake; a ``ConfigError`` names the flag that set the field."""
    if not isinstance(error, ConfigError):
        return str(error)
    flag = None
    if args.command == "prepare" and error.section == "prepare":
        flag = PREPARE_FLAGS.get(error.field)
    elif args.command in ("train", "sweep") and (error.section, error.field) in TRAIN_FLAGS:
        flag, dest = TRAIN_FLAGS[error.section, error.field]
        if getattr(args, dest, None) is None:  # set by --config or --set: name the field
            flag = None
    return error.render(flag)


class _terminate_as_exit:
    """Turn SIGTERM into SystemExit while active, so ``finally`` blocks clean up temp output."""

    def __enter__(self) -> None:
        self._previous = None
        try:
            self._previous = signal.signal(signal.SIGTERM, self._raise)
        except ValueError:  # not the main thread: leave signals alone
            self._previous = None

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    @staticmethod
    def _raise(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
