"""What ``raydiff evaluate bpd`` and ``raydiff evaluate fid`` are asked for, checked before
anything starts. No Ray here.

Each field with a flag is an option of the command (:func:`raydiff.flags.flag`): its help says
what the field means. A value refused here is a ``ConfigError`` of the field, which the command
line shows under the flag the user typed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from raydiff.errors import ConfigError
from raydiff.flags import flag
from raydiff.sample.options import ModelSource


def _invalid(options: Any, name: str, reason: str) -> ConfigError:
    value = getattr(options, name)
    return ConfigError(section=options.section, field=name, value=value, reason=reason)


@dataclass(kw_only=True)
class BpdOptions(ModelSource):
    """What ``raydiff evaluate bpd`` was asked for (validated on construction)."""

    section: ClassVar[str] = "bpd"
    """What a ``ConfigError`` of these options names as its section."""

    data: str | None = flag(
        "--data", default=None, help="prepared dataset (default: the one the model trained on)"
    )
    split: str = flag("--split", default="test", help="split to evaluate (default: %(default)s)")
    num_images: int | None = flag(
        "--num-images",
        default=None,
        help="evaluate the split's first N images (default: all; each image costs T model calls)",
    )
    timestep_respacing: str = flag(
        "--timestep-respacing",
        default="",
        help="the bound of a respaced chain, e.g. '100' (cheaper, looser; default: all steps)",
    )
    clip_denoised: bool = flag(
        "--clip-denoised",
        default=True,
        help="clip the predicted x_0 to [-1, 1] in each term (default: on, as improved-diffusion)",
    )
    batch_size: int = flag(
        "--batch-size",
        default=32,
        help="images per batch, the unit of work a worker takes (default: %(default)s)",
    )
    num_workers: int = flag(
        "--num-workers",
        default=1,
        help="Ray actors, one CPU (one thread) or one GPU each (default: %(default)s)",
    )
    use_gpu: bool = flag("--use-gpu", default=False, help="one GPU per worker")
    seed: int = flag("--seed", default=0, help="image i's noise depends only on (seed, i)")
    out: str | None = flag(
        "--out",
        default=None,
        help="results folder, a local path or a URI (default: RUN/evaluation/checkpoint_NNNNNN "
        "for a run's checkpoint)",
    )

    def __post_init__(self) -> None:
        for name in ("batch_size", "num_workers"):
            if getattr(self, name) < 1:
                raise _invalid(self, name, "must be >= 1")
        if self.num_images is not None and self.num_images < 1:
            raise _invalid(self, "num_images", "must be >= 1 (or leave it out for the whole split)")
        if self.seed < 0:
            raise _invalid(self, "seed", "must be >= 0")


@dataclass(kw_only=True)
class FidOptions:
    """What ``raydiff evaluate fid`` was asked for (validated on construction); its fields are
    ``run_fid``'s arguments."""

    section: ClassVar[str] = "fid"
    """What a ``ConfigError`` of these options names as its section."""

    samples: str = flag(
        "--samples",
        help="a `raydiff sample --out` folder, an npz or image folder (a local path or a URI)",
    )
    reference: str | None = flag(
        "--reference",
        default=None,
        help="a prepared dataset (its --split), an npz or an image folder (default: the dataset "
        "the samples' model trained on, for a `raydiff sample` folder)",
    )
    split: str = flag(
        "--split", default="test", help="the reference dataset's split (default: %(default)s)"
    )
    inception: str | None = flag(
        "--inception",
        default=None,
        help="the FID Inception weights file (default: $RAYDIFF_INCEPTION, else "
        "~/.cache/raydiff/weights-inception-2015-12-05-6726825d.pth)",
    )
    num_images: int | None = flag(
        "--num-images", default=None, help="use at most N images of each side"
    )
    batch_size: int = flag(
        "--batch-size", default=64, help="Inception batch (default: %(default)s)"
    )
    out: str | None = flag(
        "--out", default=None, help="results JSON, a path or a URI (default: beside the samples)"
    )
    features: str | None = flag(
        "--features",
        default=None,
        help="measure in the penultimate features of a clean raydiff classifier (a `raydiff "
        "train-classifier` checkpoint, e.g. of evaluator_demo) instead of Inception's: the "
        "results are named fd_classifier, kd_classifier_mean, ... (not FID)",
    )

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise _invalid(self, "batch_size", "must be >= 1")
        if self.features is not None and self.inception is not None:
            raise _invalid(
                self, "features", "measures in a classifier's features: drop --inception"
            )
        if self.num_images is not None and self.num_images < 1:
            raise _invalid(self, "num_images", "must be >= 1 (or leave it out for all images)")


@dataclass(kw_only=True)
class AccuracyOptions:
    """What ``raydiff evaluate accuracy`` was asked for; its fields are ``run_accuracy``'s
    arguments."""

    section: ClassVar[str] = "accuracy"
    """What a ``ConfigError`` of these options names as its section."""

    samples: str = flag(
        "--samples",
        help="labelled images: a `raydiff sample --out` folder or npz with arr_1 (a "
        "class-conditional or guided model's), or a prepared dataset (its --split)",
    )
    classifier: str = flag(
        "--classifier",
        help="the evaluator: a clean `raydiff train-classifier` checkpoint (e.g. of "
        "evaluator_demo), never the classifier that guided the samples",
    )
    split: str = flag(
        "--split", default="test", help="a prepared dataset's split (default: %(default)s)"
    )
    num_images: int | None = flag("--num-images", default=None, help="use the first N images only")
    out: str | None = flag(
        "--out", default=None, help="results JSON, a path or a URI (default: beside the samples)"
    )

    def __post_init__(self) -> None:
        if self.num_images is not None and self.num_images < 1:
            raise _invalid(self, "num_images", "must be >= 1 (or leave it out for all images)")
