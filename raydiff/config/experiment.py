"""The experiment config: the sections of one run, and what relates them.

Some fields follow another section's: the data pipeline takes the model's image geometry and the
run's seed (:data:`DATA_FIELDS_DERIVED`), and improved-diffusion's ``use_fp16`` asks for fp16
training. :func:`derive_sections` is the one step that fills them in, when a config is built from
a mapping (YAML, ``--set``, a checkpoint's config.json); :class:`ExperimentConfig` itself only
checks that its sections agree, and never changes one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from raydiff.config.classifier import ClassifierConfig
from raydiff.config.diffusion import DiffusionConfig
from raydiff.config.evaluation import EvaluationConfig
from raydiff.config.field_values import invalid
from raydiff.config.model import ModelConfig
from raydiff.config.optim import OptimConfig
from raydiff.config.scaling import ScalingConfig
from raydiff.config.super_res import SuperResConfig
from raydiff.config.tracking import TrackingConfig
from raydiff.config.train import TrainConfig
from raydiff.data.config import DataConfig, check_data_field
from raydiff.errors import ConfigError

DATA_FIELDS_DERIVED = {
    "image_size": "model.image_size",
    "channels": "model.in_channels",
    "class_cond": "model.class_cond",
    "seed": "train.seed",
}
"""DataConfig fields that follow a field of another section."""


@dataclass(kw_only=True, frozen=True)
class ExperimentConfig:
    """Everything that defines a run: model, diffusion, optimiser and training loop."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The UNet; its image size, channels and classes are the classifier's too."""
    classifier: ClassifierConfig = field(default_factory=ClassifierConfig)
    """The noisy classifier, when ``train.task`` is 'classifier'."""
    super_res: SuperResConfig = field(default_factory=SuperResConfig)
    """The upsampler's low-resolution input, when ``train.task`` is 'super_res'."""
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    """The diffusion process and loss."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimiser, lr schedule and EMA."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Batch, precision, length and intervals."""
    data: DataConfig = field(default_factory=DataConfig)
    """The prepared dataset and how it is streamed."""
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    """Workers, resources and failure handling on Ray."""
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    """Evaluation of checkpoints during training."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """The experiment trackers the run logs to (TensorBoard, MLflow, W&B)."""

    def __post_init__(self) -> None:
        if self.train.task == "classifier":
            self._check_classifier()
        if self.train.task == "super_res":
            self._check_super_res()
        for data_field, source in DATA_FIELDS_DERIVED.items():
            value = _source_value(vars(self), source)
            if getattr(self.data, data_field) != value:
                raise _contradiction(data_field, getattr(self.data, data_field), source, value)
        fp16_flag = _fp16_flag(self.model, self.classifier, self.train.task)
        if fp16_flag and self.train.precision != "fp16":
            section, name = fp16_flag.split(".")
            raise invalid(
                section,
                name,
                True,
                f"the original's --{name} asks for fp16 training but "
                f"train.precision={self.train.precision!r}: set one of them",
            )
        if self.evaluation.sample_precision == "fp16" and not self.scaling.use_gpu:
            raise invalid(
                "evaluation",
                "sample_precision",
                "fp16",
                "fp16 autocast needs a GPU (CPUs have no fast fp16 kernels): set "
                "scaling.use_gpu=true, or use bf16 or fp32",
            )
        if self.train.eval_timesteps > self.diffusion.diffusion_steps:
            raise invalid(
                "train",
                "eval_timesteps",
                self.train.eval_timesteps,
                f"the bits/dim estimate draws that many distinct timesteps of "
                f"diffusion.diffusion_steps={self.diffusion.diffusion_steps}; use at most that",
            )
        anneal = self.optim.lr_anneal_steps
        if anneal and self.train.max_steps > anneal:
            raise invalid(
                "train",
                "max_steps",
                self.train.max_steps,
                f"runs past optim.lr_anneal_steps={anneal}, where the learning rate has decayed "
                f"to 0 (improved-diffusion stops training there): set train.max_steps <= {anneal}"
                f" (or raise lr_anneal_steps)",
            )
        if self.evaluation.every_checkpoint:
            self.evaluation.sampling_diffusion(self.diffusion)  # the respacing fits the steps

    def _check_classifier(self) -> None:
        """A classifier trains on labels, fits its images, and has no samples to evaluate."""
        if not self.model.class_cond:
            raise invalid(
                "model",
                "class_cond",
                False,
                "train.task=classifier trains on the data's labels: set model.class_cond=true "
                "(model.num_classes is the classifier's class count)",
            )
        self.classifier.check_architecture(
            image_size=self.model.image_size,
            in_channels=self.model.in_channels,
            num_classes=self.model.num_classes,
        )
        if self.evaluation.every_checkpoint:
            raise invalid(
                "evaluation",
                "every_checkpoint",
                True,
                "evaluates a diffusion model's samples; a classifier's validation accuracy is "
                "train.eval_interval's",
            )

    def _check_super_res(self) -> None:
        """The low-resolution input is smaller than the images it is upsampled to."""
        if self.super_res.small_size >= self.model.image_size:
            raise invalid(
                "super_res",
                "small_size",
                self.super_res.small_size,
                f"an upsampler's input must be smaller than model.image_size="
                f"{self.model.image_size} (its --large_size)",
            )


def _fp16_flag(model: ModelConfig, classifier: ClassifierConfig, task: str) -> str | None:
    """The original's fp16 flag the trained network sets (``model.use_fp16`` or
    ``classifier.classifier_use_fp16``), or None."""
    if task == "classifier":
        return "classifier.classifier_use_fp16" if classifier.classifier_use_fp16 else None
    return "model.use_fp16" if model.use_fp16 else None


def derive_sections(sections: Mapping[str, Any], given_data: Mapping[str, Any]) -> dict[str, Any]:
    """The sections of an :class:`ExperimentConfig` with the fields that follow another section
    filled in: ``model.class_cond`` for a classifier (it trains on labels), ``data.image_size``
    and the other :data:`DATA_FIELDS_DERIVED`, and ``train.precision=fp16`` for the trained
    network's fp16 flag when precision was left at fp32 or auto.

    ``sections`` holds every section, built; ``given_data`` is the data section's mapping as
    given. A derived field given there must agree with its source, or it would be dropped without
    a word. Returns new sections; those passed in are not modified.
    """
    derived = dict(sections)
    train = sections["train"]
    if train.task == "classifier" and not sections["model"].class_cond:
        derived["model"] = dataclasses.replace(sections["model"], class_cond=True)
    values = {}
    for data_field, source in DATA_FIELDS_DERIVED.items():
        value = _source_value(derived, source)
        given = getattr(sections["data"], data_field)
        if data_field in given_data and given != value:
            raise _contradiction(data_field, given, source, value)
        section, name = source.split(".")
        # The data section's rule for the value, reported against the field it came from.
        check_data_field(data_field, value, section=section, field=name)
        values[data_field] = value
    derived["data"] = dataclasses.replace(sections["data"], **values)
    fp16_flag = _fp16_flag(sections["model"], sections["classifier"], train.task)
    if fp16_flag and train.precision in ("fp32", "auto"):
        derived["train"] = dataclasses.replace(train, precision="fp16")
    return derived


def _source_value(sections: Mapping[str, Any], source: str) -> Any:
    section, name = source.split(".")
    return getattr(sections[section], name)


def _contradiction(data_field: str, given: Any, source: str, value: Any) -> ConfigError:
    return invalid(
        "data",
        data_field,
        given,
        f"it contradicts {source}={value!r}: data.{data_field} follows {source}; set {source} "
        f"(or leave data.{data_field} out)",
    )
