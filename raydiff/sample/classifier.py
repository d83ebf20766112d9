"""Classifier guidance: a noisy-image classifier and the ``cond_fn`` it gives.

ADM (Dhariwal & Nichol 2021, alg. 1) shifts each reverse step's mean by
``s * Sigma * grad_x log p_phi(y | x_t, t)``; the core does the shift
(``GaussianDiffusion.condition_mean``, and ``condition_score`` for DDIM, alg. 2) given a
``cond_fn(x_t, t, y)`` that returns ``s * grad_x log p_phi(y | x_t, t)``. The classifier is a
raydiff classifier checkpoint (``raydiff train-classifier``; its config.json describes it) or a
published guided-diffusion ``.pt`` (``64x64_classifier.pt`` etc.) with the ``classifier_*``
flags it was trained with. Either way it is described by an ``ExperimentConfig`` of
``train.task=classifier``, built by :func:`raydiff.factory.create_classifier`. No Ray here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from raydiff.config import DATA_FIELDS_DERIVED, ExperimentConfig, from_dict, to_dict
from raydiff.core.gaussian_diffusion import CondFn
from raydiff.errors import UserInputError
from raydiff.factory import create_classifier
from raydiff.storage import StoragePath, as_location, local_copy
from raydiff.train.checkpoint import load_model_weights

MODEL_FLAGS = ("image_size", "in_channels", "num_classes")
"""Flags of ``--classifier-flags`` that describe the images and classes (the model section)."""


@dataclass(kw_only=True)
class Classifier:
    """A classifier ready to use (eval mode, CPU) and the config that describes it."""

    network: torch.nn.Module
    config: ExperimentConfig


def classifier_config_from_flags(
    flags: dict[str, str], *, model_config: ExperimentConfig
) -> ExperimentConfig:
    """A published classifier's config: guided-diffusion's ``classifier_*`` flags; its images and
    classes are those of the diffusion model of ``model_config`` unless the flags give
    ``image_size`` / ``in_channels`` / ``num_classes``."""
    data = to_dict(model_config)
    data["train"] = {**data["train"], "task": "classifier"}
    data["model"] = {**data["model"], "class_cond": True}
    data["classifier"], data["evaluation"] = {}, {}
    # The data fields that follow the model section follow the classifier's.
    data["data"] = {k: v for k, v in data["data"].items() if k not in DATA_FIELDS_DERIVED}
    for name, value in flags.items():
        data["model" if name in MODEL_FLAGS else "classifier"][name] = value
    return from_dict(ExperimentConfig, data)


def load_classifier(
    path: str | StoragePath,
    *,
    flags: dict[str, str] | None = None,
    model_config: Any = None,
    flag: str = "--classifier",
    weights: str | None = None,
) -> Classifier:
    """The classifier at ``path``: a raydiff classifier checkpoint folder (its config.json
    describes it; ``flags`` must be None; ``weights`` picks ``model``, an ``ema_RATE`` or a
    ``phema_LENGTH`` of it, default: its first EMA rate, else its model), or a published state
    dict described by ``flags`` (for the images and classes of ``model_config``'s model). A
    checkpoint of a diffusion model, or flags that do not match the file's keys, is a one-line
    error naming ``flag``."""
    from raydiff.sample.load import load_sampling_model

    location = as_location(path)
    if location.is_dir():
        if flags:
            raise UserInputError(
                f"{flag} {path} is a raydiff checkpoint: its config.json describes the "
                f"classifier (--classifier-flags are for published .pt files)"
            )
        loaded = load_sampling_model(location, task="classifier", weights=weights)
        return Classifier(network=loaded.model, config=loaded.config)
    if weights is not None:
        raise UserInputError(f"{flag}-weights applies to raydiff checkpoints; {path} is one file")
    if not location.is_file():
        raise FileNotFoundError(f"{flag} {str(path)!r} does not exist")
    if model_config is None:
        raise UserInputError(
            f"{flag} {path} is a published state dict: it needs the diffusion model's "
            f"config and its --classifier-flags"
        )
    config = classifier_config_from_flags(flags or {}, model_config=model_config)
    network = create_classifier(config)
    with local_copy(location) as file:
        load_model_weights(network, file)
    return Classifier(network=network.eval(), config=config)


def check_guides(classifier: ExperimentConfig, model: ExperimentConfig, *, name: str) -> None:
    """Refuse a classifier that cannot guide ``model``: other images, other diffusion steps, or
    other classes than a class-conditional model's."""
    c, m = classifier.model, model.model
    if (c.image_size, c.in_channels) != (m.image_size, m.in_channels):
        raise UserInputError(
            f"{name} classifies {c.image_size}x{c.image_size}x{c.in_channels} images, the model "
            f"draws {m.image_size}x{m.image_size}x{m.in_channels}: they must agree"
        )
    if m.class_cond and c.num_classes != m.num_classes:
        raise UserInputError(
            f"{name} has {c.num_classes} classes, the model {m.num_classes}: they must agree"
        )
    if classifier.diffusion.diffusion_steps != model.diffusion.diffusion_steps:
        raise UserInputError(
            f"{name} was trained on T={classifier.diffusion.diffusion_steps} diffusion steps, "
            f"the model on T={model.diffusion.diffusion_steps}: its timesteps would not match"
        )


@dataclass(frozen=True, kw_only=True)
class Guidance:
    """A classifier that guides sampling, as the sampling actors take it: the config that
    describes its network, its weights and the guidance scale ``s``."""

    config: ExperimentConfig
    weights: dict[str, torch.Tensor]
    scale: float

    @classmethod
    def of(cls, classifier: Classifier, *, scale: float) -> Guidance:
        """``classifier``'s guidance at ``scale``, its weights on the CPU."""
        weights = {k: v.cpu() for k, v in classifier.network.state_dict().items()}
        return cls(config=classifier.config, weights=weights, scale=scale)

    def cond_fn(self, device: torch.device) -> CondFn:
        """Its network built and loaded on ``device`` (half precision on a GPU where its
        config's ``classifier_use_fp16`` says so), as a :func:`classifier_cond_fn`."""
        network = create_classifier(self.config)
        network.load_state_dict(self.weights, strict=True)
        if self.config.classifier.classifier_use_fp16 and device.type == "cuda":
            network.convert_to_fp16()
        return classifier_cond_fn(network.eval().to(device), scale=self.scale)


def classifier_cond_fn(classifier: torch.nn.Module, *, scale: float) -> CondFn:
    """``cond_fn(x_t, t, y)`` = ``scale * grad_x log p(y | x_t, t)`` (ADM eq. 10's gradient).

    ``t`` arrives in the classifier's (original) timesteps: a respaced diffusion maps them first.
    """

    def cond_fn(x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        if y is None:
            raise ValueError("classifier guidance needs class labels y")
        with torch.enable_grad():
            x_in = x.detach().requires_grad_(True)
            log_probs = F.log_softmax(classifier(x_in, t).float(), dim=-1)
            selected = log_probs[torch.arange(len(y), device=y.device), y.view(-1)]
            return torch.autograd.grad(selected.sum(), x_in)[0] * scale

    return cond_fn
