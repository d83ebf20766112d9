"""``raydiff train-classifier`` (``python jobs/train_classifier.py``): guided-diffusion's
``classifier_train.py`` on Ray Train. The same command as ``raydiff train`` (the same flags, run
folders, checkpoints, resume and recovery) with a classifier config: ``train.task=classifier``
and its ``classifier`` section (docs/classifier.md)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from raydiff.cli.arguments import add_options, options_from_args
from raydiff.cli.train import TrainOptions, train
from raydiff.flags import flag

HELP = "train guided-diffusion's noisy classifier (default: Fashion-MNIST, for the demo's model)"


@dataclass(kw_only=True)
class ClassifierTrainOptions(TrainOptions):
    """``raydiff train``'s options with a classifier's defaults."""

    config: str = flag(
        "--config",
        default="classifier_demo",
        help="YAML config file with train.task=classifier, or a preset's name "
        "(classifier_demo: the noisy classifier of the demo's diffusion; evaluator_demo: a clean "
        "Fashion-MNIST evaluator; classifier_imagenet64, classifier_imagenet128, "
        "classifier_imagenet256: guided-diffusion's published recipes) (default: %(default)s)",
    )
    output: str = flag(
        "--output",
        default="runs/classifier_demo",
        help="run folder: a local path or a URI pyarrow reads (default: %(default)s)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of :class:`ClassifierTrainOptions` and ``--address``."""
    add_options(parser, ClassifierTrainOptions, address=True)


def run(args: argparse.Namespace) -> int:
    """Train the classifier of the config."""
    options = options_from_args(ClassifierTrainOptions, args)
    return train(options, address=args.address, task="classifier")
