"""Configs as YAML: the shipped presets (``configs/*.yaml``), loading a file or a preset with
``--set`` overrides, and writing a config back."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raydiff.config.experiment import DATA_FIELDS_DERIVED, ExperimentConfig
from raydiff.config.overrides import from_dict, set_fields, to_dict
from raydiff.errors import UserInputError

PRESETS_DIR = Path(__file__).resolve().parent.parent / "configs"
"""The presets shipped with the package (``configs/`` in the repository links here)."""

SWEEP_PREFIX = "sweep_"
"""Shipped files named ``sweep_*.yaml`` are sweep files (``raydiff sweep``), not presets."""
FAMILY_PREFIX = "family_"
"""Shipped files named ``family_*.yaml`` are family files (``raydiff family``), not presets."""


def preset_names() -> list[str]:
    """Names of the shipped training presets (``demo``, ``cifar10_hybrid``, ...)."""
    others = (SWEEP_PREFIX, FAMILY_PREFIX)
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml") if not p.stem.startswith(others))


def resolve_config_path(path_or_preset: str) -> Path:
    """A YAML file's path, or a shipped preset's by name (``cifar10_hybrid``)."""
    return _file_or_shipped(
        path_or_preset,
        names=preset_names(),
        missing=f"config file {path_or_preset!r} does not exist (presets by name: ",
    )


def _file_or_shipped(path_or_name: str, *, names: list[str], missing: str) -> Path:
    """A file's path, or the shipped file of one of ``names``; ``missing`` leads the refusal,
    which lists the names."""
    file = Path(path_or_name)
    if file.is_file():
        return file
    name = path_or_name.removesuffix(".yaml")
    if "/" not in path_or_name and name in names:
        return PRESETS_DIR / f"{name}.yaml"
    raise FileNotFoundError(f"{missing}{', '.join(names)})")


def config_source(path_or_preset: str, *, beside: Path) -> str:
    """A config as a sweep or family file names it, as ``--config`` takes it: a file relative to
    that file's folder ``beside`` by its path there, else as given (a FileNotFoundError naming
    the presets when it is neither a file nor a preset)."""
    near = beside / path_or_preset
    if not Path(path_or_preset).is_file() and near.is_file():
        return str(near)
    resolve_config_path(path_or_preset)
    return path_or_preset


def shipped_file(path_or_name: str, *, prefix: str, kind: str) -> Path:
    """A file's path, or a shipped ``PREFIX*.yaml`` one's by name (``sweep_demo``,
    ``family_demo``); ``kind`` names what it is in the refusal (``sweep``)."""
    return _file_or_shipped(
        path_or_name,
        names=sorted(p.stem for p in PRESETS_DIR.glob(f"{prefix}*.yaml")),
        missing=f"{kind} file {path_or_name!r} does not exist (shipped {kind} files by name: ",
    )


def read_yaml_mapping(file: Path, *, what: str, holds: str) -> dict[str, Any]:
    """The mapping a YAML file holds (an empty file: {}); ``what`` names the file in a
    refusal (``family file 'f.yaml'``), ``holds`` what it should hold (``stages``)."""
    import yaml

    try:
        data = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as err:
        detail = " ".join(str(err).split())  # the parser's report spans several lines
        raise UserInputError(f"{what} is not valid YAML: {detail}") from None
    if not isinstance(data, Mapping):
        raise UserInputError(f"{what} must hold a mapping of {holds}")
    return dict(data)


def read_config(path: str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """The nested mapping a config is built from: a YAML file's or preset's fields (or none)
    with the ``--set`` overrides set, each overridden value converted to its field's type.
    Unknown fields are refused; the sections are not built (:func:`load_config` builds them)."""
    data: dict[str, Any] = {}
    if path is not None:
        file = resolve_config_path(path)
        data = read_yaml_mapping(file, what=f"config file {str(file)!r}", holds="config sections")
    if "search_space" in data:
        raise UserInputError(
            f"{path} is a sweep file (it has a search_space): run it with `raydiff sweep "
            f"--config {path} --output DIR`"
        )
    return set_fields(dict(data), overrides or [])


def load_config(path: str | None = None, overrides: list[str] | None = None) -> ExperimentConfig:
    """An ``ExperimentConfig`` from a YAML file or preset name (or the defaults) plus ``--set``
    overrides."""
    return from_dict(ExperimentConfig, read_config(path, overrides))


def to_yaml(config: ExperimentConfig) -> str:
    """The config as YAML that :func:`load_config` reads back (derived fields left out)."""
    import yaml

    data = to_dict(config)
    for data_field in DATA_FIELDS_DERIVED:
        del data["data"][data_field]
    return yaml.safe_dump(data, sort_keys=False)
