"""The model to sample from: a raydiff checkpoint (raw or EMA weights) or a published
improved-/guided-diffusion ``.pt`` with the flags it was trained with. No Ray here."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import torch

from raydiff.config import (
    ExperimentConfig,
    apply_overrides,
    config_from_flags,
    load_config,
)
from raydiff.config.resolve import saved_config
from raydiff.errors import UserInputError
from raydiff.storage import StoragePath, as_location, local_copy
from raydiff.train.checkpoint import load_model_weights, require_checkpoint_dir
from raydiff.train.tasks import task_spec


@dataclass(kw_only=True)
class SamplingModel:
    """A model ready to sample, the config that describes it, and where its weights came from."""

    model: torch.nn.Module
    config: ExperimentConfig
    weights: Path
    """The state-dict file loaded."""


def parse_model_flags(text: str) -> dict[str, str]:
    """improved-diffusion's ``MODEL_FLAGS`` syntax: ``"--image_size 64 --learn_sigma True"``
    (``--flag=value`` too) -> ``{"image_size": "64", "learn_sigma": "True"}``."""
    flags: dict[str, str] = {}
    words = shlex.split(text)
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--") or len(word) == 2:
            raise UserInputError(
                f"--model-flags: {word!r} is not a flag; expected improved-diffusion's syntax, "
                f"e.g. '--image_size 64 --num_channels 128 --learn_sigma True'"
            )
        name, sep, value = word[2:].partition("=")
        if not sep:
            if i + 1 >= len(words) or words[i + 1].startswith("--"):
                raise UserInputError(f"--model-flags: --{name} has no value")
            value = words[i + 1]
            i += 1
        flags[name] = value
        i += 1
    return flags


def load_sampling_model(
    path: str | StoragePath,
    *,
    weights: str | None = None,
    model_flags: str | None = None,
    config_file: str | None = None,
    task: str = "diffusion",
    or_task: str | None = None,
) -> SamplingModel:
    """The model at ``path``, in eval mode on the CPU.

    ``task``: what the checkpoint must have trained (``train.task``): the diffusion model, an
    upsampler (``super_res``: a ``SuperResModel``; a published .pt's flags then describe one), or
    a classifier (whose network is then the model); a checkpoint of another task is refused.
    ``or_task``: a second task accepted from a raydiff checkpoint (``raydiff evaluate bpd``
    takes a diffusion model or an upsampler); the checkpoint's own then decides.

    ``path``: a raydiff ``checkpoint_NNNNNN`` folder (its ``config.json`` describes the model;
    ``weights`` picks ``model`` or ``ema_RATE``, default: the config's first EMA rate), or a
    published ``.pt`` state dict, whose model is described by ``model_flags`` (improved-diffusion
    syntax) or ``config_file``; a local path or a URI (downloaded into a temporary folder under
    its own name for the load). Every mistake (a missing or incomplete checkpoint, an unknown EMA
    rate, flags that do not match the file's keys) is a one-line error naming it.
    """
    location = as_location(path)
    with local_copy(location) as local:
        try:
            return _load_local_model(
                local,
                weights=weights,
                model_flags=model_flags,
                config_file=config_file,
                task=task,
                or_task=or_task,
            )
        except UserInputError as error:  # name the URI, not the temporary download
            message = str(error)
            if str(local) == str(location) or str(local) not in message:
                raise
            raise UserInputError(message.replace(str(local), str(location))) from None


def _load_local_model(
    path: Path,
    *,
    weights: str | None,
    model_flags: str | None,
    config_file: str | None,
    task: str,
    or_task: str | None,
) -> SamplingModel:
    """:func:`load_sampling_model` of a local path."""
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    if path.is_dir():
        if model_flags or config_file:
            raise UserInputError(
                f"{path} is a raydiff checkpoint: its config.json describes the model "
                f"(--model-flags / --config are for published .pt files)"
            )
        if or_task is not None and _checkpoint_task(path) == or_task:
            task = or_task
        config, file = _checkpoint_weights(path, weights, task)
    else:
        config, file = _published_weights(path, weights, model_flags, config_file)
        if or_task is not None and config.train.task == or_task:
            task = or_task  # its config file or flags (--task super_res) say which
        elif config.train.task != task:  # a published model's flags name no task
            config = apply_overrides(config, [f"train.task={task}"])
    model = task_spec(task).network(config)
    load_model_weights(model, file)
    return SamplingModel(model=model.eval(), config=config, weights=file)


def _checkpoint_task(path: Path) -> str:
    """The ``train.task`` of a raydiff checkpoint folder ("" without a readable config)."""
    try:
        return str(json.loads((path / "config.json").read_text())["train"]["task"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def _checkpoint_weights(
    path: Path, weights: str | None, task: str
) -> tuple[ExperimentConfig, Path]:
    """A raydiff checkpoint's config and the file of ``weights`` (default: its first EMA)."""
    checkpoint = require_checkpoint_dir(path)
    config = saved_config(checkpoint)
    if config.train.task != task:
        raise UserInputError(
            f"{checkpoint} is a checkpoint of train.task={config.train.task!r}, not of a "
            f"{task} model ({task_spec(config.train.task).usage(str(checkpoint))})"
        )
    # Fixed-rate EMAs, then those `raydiff ema` reconstructed (post-hoc, by length).
    emas = [*sorted(checkpoint.glob("ema_*.pt")), *sorted(checkpoint.glob("phema_*.pt"))]
    choices = {"model": checkpoint / "model.pt", **{f.stem: f for f in emas}}
    if weights is None:
        rates = config.optim.ema_rates()
        weights = f"ema_{rates[0]}" if rates and f"ema_{rates[0]}" in choices else "model"
    if weights not in choices:
        raise UserInputError(
            f"--weights {weights}: {checkpoint} has no such weights; valid: {', '.join(choices)}"
        )
    return config, choices[weights]


def _published_weights(
    path: Path, weights: str | None, model_flags: str | None, config_file: str | None
) -> tuple[ExperimentConfig, Path]:
    """A published state dict's config, from its flags or a config file, and the file."""
    if weights is not None:
        raise UserInputError(f"--weights applies to raydiff checkpoints; {path} is one file")
    if bool(model_flags) == bool(config_file):
        raise UserInputError(
            f"{path} is a published state dict: describe its model with --model-flags "
            f"'--image_size 64 --num_channels 128 ...' (the flags it was trained with) or "
            f"--config FILE.yaml, one of them"
        )
    if model_flags:
        return config_from_flags(parse_model_flags(model_flags)), path
    return load_config(config_file), path
