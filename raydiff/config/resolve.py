"""A run's config as every command builds it: a preset or file, ``--set`` overrides, and the
prepared data it trains on (:func:`resolve_config`); and the config a run saved
(:func:`saved_config`). No Ray, no torch.

``raydiff train``, ``train-classifier``, a sweep's base config and every stage of a family are
built here, so a config one of them refuses is refused by all of them, before anything starts.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from raydiff.config.experiment import ExperimentConfig
from raydiff.config.model import ModelConfig
from raydiff.config.overrides import apply_overrides, coerce, from_dict, resolve_field
from raydiff.config.presets import read_config
from raydiff.data.manifest import Manifest, load_manifest
from raydiff.errors import ConfigError
from raydiff.storage import StoragePath, as_location

logger = logging.getLogger(__name__)


def resolve_config(
    source: str | None,
    *,
    overrides: Sequence[str] = (),
    check: Callable[[ExperimentConfig], None] | None = None,
    manifest_for: Callable[[str], Manifest] | None = None,
) -> tuple[ExperimentConfig, Manifest | None]:
    """The config of ``source`` (a preset's name or a YAML file; None: the defaults) with the
    ``--set`` ``overrides``, fitted to its dataset (:func:`fit_to_data`), and that dataset's
    manifest.

    The dataset is the one ``data.data_dir`` names when it is prepared already, else
    ``manifest_for(data_dir)``'s (``raydiff train`` prepares the embedded demo's there); with
    neither, the config comes back unfitted and the manifest None. ``check`` (the command's own
    rules) sees the config before ``manifest_for`` is called, so a refused config has no side
    effect. ``model.in_channels`` set by an override, and ``model.num_classes`` set anywhere,
    are kept: a dataset unlike them is refused.
    """
    data = read_config(source, list(overrides))
    manifest = _existing_manifest(data)
    model = data.get("model") or {}
    if manifest is not None and isinstance(model, Mapping):  # not a mapping: from_dict says so
        # The size before the model's own checks, which would name a consequence of a wrong
        # size (an attention resolution or a channel_mult entry it lacks), not the size.
        size = model.get("image_size", ModelConfig.image_size)
        check_image_size(coerce(size, int, section="model", name="image_size"), manifest)
    config = from_dict(ExperimentConfig, data)
    if check is not None:
        check(config)
    if manifest is None and manifest_for is not None:
        manifest = manifest_for(config.data.data_dir)
    if manifest is None:
        return config, None
    set_by_overrides = {resolve_field(item.partition("=")[0]) for item in overrides}
    fitted = fit_to_data(
        config,
        manifest,
        keep_channels=("model", "in_channels") in set_by_overrides,
        keep_classes="num_classes" in model,
    )
    return fitted, manifest


def saved_config(folder: StoragePath) -> ExperimentConfig:
    """The config a run folder or a checkpoint saved (its ``config.json``)."""
    text = (as_location(folder) / "config.json").read_text()
    return from_dict(ExperimentConfig, json.loads(text))


def _existing_manifest(data: Mapping[str, Any]) -> Manifest | None:
    """The manifest of the dataset that a config mapping names, or None when it is not there."""
    from raydiff.data.config import DataConfig

    section = data.get("data")
    if section is not None and not isinstance(section, Mapping):
        return None  # from_dict names the bad section
    data_dir = (section or {}).get("data_dir", DataConfig.data_dir)
    try:
        return load_manifest(str(data_dir)) if data_dir else None
    except FileNotFoundError:
        return None


def check_image_size(image_size: int, manifest: Manifest) -> None:
    """A model of ``image_size`` pixels cannot train on ``manifest``'s images of another size:
    a ConfigError naming ``model.image_size`` and the size that fits (the size shapes the whole
    UNet, so nothing adapts it)."""
    if manifest.image_size != image_size:
        raise ConfigError(
            section="model",
            field="image_size",
            value=image_size,
            reason=f"the dataset {manifest.root} holds {manifest.image_size}x"
            f"{manifest.image_size} images: train at their size with --set image_size="
            f"{manifest.image_size}, or prepare the data again with --image-size {image_size}",
        )


def fit_to_data(
    config: ExperimentConfig,
    manifest: Manifest,
    *,
    keep_channels: bool = False,
    keep_classes: bool = False,
) -> ExperimentConfig:
    """``config`` made to train on ``manifest``'s images, or a ConfigError saying how.

    A preset's ``model.in_channels`` follows the data (the demo model trains on an RGB folder as
    well as on Fashion-MNIST): the channel count only changes the first and last convolution.
    ``keep_channels`` (the user set ``in_channels`` themselves) turns that into an error. A
    class-conditional model's ``num_classes`` follows the data's labels in the same way
    (improved-diffusion's constant 1000 would give Fashion-MNIST 990 unused class embeddings,
    and a classifier of the same data could not guide it); ``keep_classes`` (the config sets
    ``num_classes``) turns a mismatch into an error naming both counts. The image size shapes
    the whole UNet, so a mismatch is an error that names both ways out.
    """
    model = config.model
    check_image_size(model.image_size, manifest)
    config = _fit_classes(config, manifest, keep_classes=keep_classes)
    if manifest.channels != model.in_channels:
        if keep_channels:
            raise ConfigError(
                section="model",
                field="in_channels",
                value=model.in_channels,
                reason=f"the dataset {manifest.root} holds {manifest.channels}-channel images: "
                f"drop the override (the model then takes the data's channels) or set "
                f"in_channels={manifest.channels}",
            )
        logger.info(
            "the dataset has %d-channel images: model.in_channels=%d (the config had %d)",
            manifest.channels,
            manifest.channels,
            model.in_channels,
        )
        config = apply_overrides(config, [f"model.in_channels={manifest.channels}"])
    return config


def _fit_classes(
    config: ExperimentConfig, manifest: Manifest, *, keep_classes: bool
) -> ExperimentConfig:
    """A class-conditional model's ``num_classes`` from the data's labels (an unlabelled
    dataset is refused later, by ``check_compatible``)."""
    model = config.model
    found = manifest.num_classes
    if not model.class_cond or not found or model.num_classes == found:
        return config
    if keep_classes:
        raise ConfigError(
            section="model",
            field="num_classes",
            value=model.num_classes,
            reason=f"the dataset {manifest.root} has {found} classes: set num_classes={found}, "
            f"or leave it out (a class-conditional model takes the data's class count)",
        )
    logger.info(
        "the dataset has %d classes: model.num_classes=%d (the config had %d)",
        found,
        found,
        model.num_classes,
    )
    return apply_overrides(config, [f"model.num_classes={found}"])
