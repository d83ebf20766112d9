"""``raydiff train`` (``python jobs/train.py``): build the config, check it, prepare the embedded
dataset if needed, and train on Ray (or in this process with ``--single-process``)."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raydiff.cli.arguments import (
    add_options,
    options_from_args,
    set_by_flags,
)
from raydiff.errors import UserInputError
from raydiff.flags import flag

if TYPE_CHECKING:
    from raydiff.config import ExperimentConfig
    from raydiff.data.manifest import Manifest

logger = logging.getLogger(__name__)

HELP = "train a diffusion model (default: the Fashion-MNIST demo)"

DEFAULT_CONFIG = "demo"  # a preset name: raydiff/configs/demo.yaml (configs/demo.yaml)
DEFAULT_DATA = "data/fashion-mnist"


@dataclass(kw_only=True)
class TrainOptions:
    """What ``raydiff train`` was asked for: a config (a file or preset, ``--set`` overrides and
    the flags that set one field each) and where the run goes."""

    config: str = flag(
        "--config",
        default=DEFAULT_CONFIG,
        help="YAML config file, or a preset's name (demo, cifar10_hybrid, cifar10_vlb, "
        "imagenet64_hybrid, imagenet64_cond; configs/NAME.yaml) (default: demo, the "
        "Fashion-MNIST demo)",
    )
    overrides: list[str] = flag(
        "--set",
        default_factory=list,
        action="append",
        metavar="FIELD=VALUE",
        help="override a config field: section.field=value, or a unique improved-diffusion "
        "flag name (noise_schedule=cosine); repeatable",
    )
    data: str | None = flag(
        "--data",
        default=None,
        sets="data.data_dir",
        help="prepared dataset (folder or URI with manifest.json); sets data.data_dir (default: "
        f"the config's data.data_dir; {DEFAULT_DATA}, the demo's, is prepared from "
        "fashion-mnist when missing)",
    )
    output: str = flag(
        "--output",
        default="runs/demo",
        help="run folder: a local path or a URI pyarrow reads, e.g. s3://bucket/prefix/run (S3 "
        "from the standard AWS_* variables, AWS_ENDPOINT_URL included) (default: %(default)s)",
    )
    max_steps: int | None = flag(
        "--max-steps", default=None, sets="train.max_steps", help="sets train.max_steps"
    )
    num_workers: str | None = flag(
        "--num-workers",
        default=None,
        sets="scaling.num_workers",
        help="sets scaling.num_workers (Ray Train workers): N, or MIN-MAX for an elastic run",
    )
    single_process: bool = flag(
        "--single-process",
        default=False,
        help="train in this process without Ray (one worker, in-memory data; on the GPU with "
        "scaling.use_gpu)",
    )
    resume: str | None = flag(
        "--resume",
        default=None,
        help="checkpoint folder (or URI) to continue from (default: the newest under --output)",
    )
    evaluate_checkpoints: bool = flag(
        "--evaluate-checkpoints",
        default=False,
        sets="evaluation.every_checkpoint",
        help="evaluate every checkpoint on a Ray actor while training goes on (samples, "
        "bits/dim on val images, FID with evaluation.inception); sets "
        "evaluation.every_checkpoint",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of :class:`TrainOptions` and ``--address``."""
    add_options(parser, TrainOptions, address=True)


def run(args: argparse.Namespace) -> int:
    """Build the config, check it, prepare the embedded dataset if needed, and train."""
    return train(options_from_args(TrainOptions, args), address=args.address)


def train(options: TrainOptions, *, address: str | None, task: str | None = None) -> int:
    """Train what ``options`` ask for (on Ray, or in this process); ``task``: the
    ``train.task`` the config must have (None: any)."""
    from raydiff.storage import resolve_location

    config, manifest = checked_config(options, task=task)
    output = resolve_location(options.output)  # an absolute local path, or a URI (s3://, gs://)
    if options.single_process:
        from raydiff.train.local import run_single_process

        result = run_single_process(
            config, output_dir=output, resume=options.resume or None, manifest=manifest
        )
    else:
        from raydiff.orchestrate.training_job import run_training_job

        result = run_training_job(
            config,
            output_dir=output,
            resume=options.resume,
            manifest=manifest,
            address=address,
        )
    print(f"final metrics: {format_result(result, task=config.train.task)}")
    if "evaluation" in result:
        evaluation = result["evaluation"]
        print(f"evaluation:    {format_evaluation(evaluation) or evaluation.get('error')}")
    from raydiff.tracking.tensorboard import EVENTS_DIR

    print(f"run folder:    {output}")
    print(f"tensorboard:   tensorboard --logdir {output / EVENTS_DIR}")
    return 0


def checked_config(
    options: TrainOptions, *, task: str | None = None
) -> tuple[ExperimentConfig, Manifest]:
    """The run's config, fitted to its dataset, and the dataset's manifest (read once for the
    whole run). Everything the config decides is checked before any side effect: the embedded
    dataset is prepared only for a config that passed. ``task``: the ``train.task`` the config
    must have (None: any)."""
    from raydiff.config.resolve import resolve_config

    def check(config: ExperimentConfig) -> None:
        if task is not None and config.train.task != task:
            raise UserInputError(
                f"--config {options.config} trains train.task={config.train.task!r}, not "
                f"{task!r}: give a {task} config (or --set train.task={task})"
            )
        if options.single_process and config.evaluation.every_checkpoint:
            raise UserInputError(
                "evaluation.every_checkpoint needs Ray (an evaluation actor beside the "
                "training): drop --single-process, or evaluate checkpoints afterwards with "
                "raydiff evaluate"
            )
        # One process trains the whole batch: scaling.num_workers does not apply to it.
        if options.single_process:
            config.train.per_worker_batch(1)
        else:
            config.train.check_worker_sizes(config.scaling.worker_sizes)

    overrides = [*options.overrides, *set_by_flags(options)]
    config, manifest = resolve_config(
        options.config, overrides=overrides, check=check, manifest_for=manifest_preparing_demo
    )
    assert manifest is not None  # manifest_preparing_demo gives one or raises
    return config, manifest


def manifest_preparing_demo(data_dir: str) -> Manifest:
    """The manifest of the dataset at ``data_dir``; the embedded Fashion-MNIST dataset
    (``data/fashion-mnist``) is prepared first when it is missing."""
    from pathlib import Path

    from raydiff.data.manifest import load_manifest
    from raydiff.storage import resolved

    embedded = resolved(data_dir) == resolved(DEFAULT_DATA)
    if embedded and not (Path(data_dir) / "manifest.json").is_file():
        from raydiff.data.prepare import PrepareOptions, prepare_dataset

        logger.info("preparing the embedded Fashion-MNIST dataset into %s (once)", data_dir)
        # Before Ray starts: SIGTERM is Ctrl-C here (raydiff.cli.app), so a stopped preparation
        # removes its temporary folder on the way out.
        print(prepare_dataset(PrepareOptions(source="fashion-mnist", out=data_dir)).format())
    return load_manifest(data_dir)


def format_result(metrics: dict[str, Any], *, task: str) -> str:
    """A run's final step and its task's headline metrics, on one line."""
    from raydiff.train.reporting import headline_fields
    from raydiff.train.tasks import task_spec

    step = f"step {metrics['step']}  " if "step" in metrics else ""
    return step + headline_fields(metrics, task=task_spec(task))


def format_evaluation(evaluation: dict[str, Any]) -> str:
    """A checkpoint evaluation's figures on one line."""
    from raydiff.evaluate.checkpoint import SCALARS

    return "  ".join(
        f"{k} {evaluation[k]:.4g}" for k in SCALARS if isinstance(evaluation.get(k), int | float)
    )
