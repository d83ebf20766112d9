"""Configs as plain mappings and back, and ``--set`` overrides.

A config round-trips through nested dicts (YAML, a checkpoint's config.json). Values from YAML or
the command line are converted by one rule, :func:`coerce`, driven by each field's type hint; the
section's own ``__post_init__`` then checks the value. ``--set section.field=value`` overrides one
field, and an improved-diffusion flag name is accepted bare where only one section has it.

The coercion is written out rather than a library's (cattrs was tried): every hook would still be
raydiff's own (``yes`` as True, refusing 2.5 as an integer, each message), and turning its
grouped errors back into ``section.field`` ones took more code than it removed.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar, get_args, get_origin

from raydiff.config.experiment import DATA_FIELDS_DERIVED, ExperimentConfig, derive_sections
from raydiff.config.scaling import WorkerCount
from raydiff.errors import ConfigError, UserInputError

ConfigT = TypeVar("ConfigT")

FLAGS_ELSEWHERE = {
    "resume_checkpoint": "use `raydiff train --resume PATH` (a checkpoint_NNNNNN folder)",
    "fp16_scale_growth": "torch.amp.GradScaler grows the loss scale by itself; "
    "train.initial_loss_scale sets where it starts",
    "use_kl_loss": "set diffusion.use_kl",
    "clip_denoised": "a sampling option (the sample grids always clip), not a training flag",
}
"""improved-/guided-diffusion flags with no field of that name, and what to use instead."""

FLAG_ALIASES = {"large_size": ("model", "image_size")}
"""improved-/guided-diffusion flags that are a field under another name: an upsampler's
``--large_size`` is its ``image_size`` (``sr_create_model`` passes it as that)."""

_BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def to_dict(config: Any) -> dict[str, Any]:
    """A nested plain dict of a config dataclass (for YAML and checkpoints)."""
    return dataclasses.asdict(config)


def from_dict(cls: type[ConfigT], data: Any, *, where: str = "") -> ConfigT:
    """``cls`` built from a mapping: the one reader of every file raydiff reads (a config and its
    sections, a sweep file, a family file's blocks, ``raydiff ema --config``).

    ``where`` names the mapping in refusals (``model``, ``sweep``, ``stage sample``; a config's
    top level: ``config``). Values are checked and converted as :func:`field_values` says. An
    :class:`ExperimentConfig` gets the fields that follow other sections derived
    (:func:`~raydiff.config.experiment.derive_sections`).
    """
    values = field_values(cls, data, where=where)
    if cls is ExperimentConfig:
        hints = typing.get_type_hints(cls)
        sections = {
            f.name: values[f.name] if f.name in values else hints[f.name]()
            for f in dataclasses.fields(cls)
        }
        values = derive_sections(sections, data.get("data", {}))
    return cls(**values)


def field_values(cls: type, data: Any, *, where: str = "") -> dict[str, Any]:
    """The values ``data`` gives ``cls``'s fields: unknown keys refused (:func:`refuse_unknown`),
    each value converted by its field's type (:func:`coerce`; a refusal is a ConfigError of the
    class's ``section``, else of ``where``), a dataclass-typed field read by :func:`from_dict`
    (its ``where``: ``where.field``; a config's sections: the section's name)."""
    shown = where or "config"
    if not isinstance(data, Mapping):
        raise UserInputError(f"{shown}: expected a mapping of fields, got {type(data).__name__}")
    refuse_unknown(data, [f.name for f in dataclasses.fields(cls) if f.init], where=shown)
    hints = typing.get_type_hints(cls)
    section = getattr(cls, "section", where)
    return {
        name: from_dict(hints[name], value, where=f"{where}.{name}" if where else name)
        if dataclasses.is_dataclass(hints[name])
        else coerce(value, hints[name], section=section, name=name)
        for name, value in data.items()
    }


def refuse_unknown(keys: Iterable[Any], valid: Sequence[str], *, where: str) -> None:
    """Refuse the first of ``keys`` that is not ``valid``, in the words every file raydiff
    reads uses: ``where: unknown key 'K' (valid: ...)``."""
    unknown = [key for key in keys if key not in valid]
    if unknown:
        raise UserInputError(f"{where}: unknown key {unknown[0]!r} (valid: {', '.join(valid)})")


def coerce(value: Any, hint: Any, *, section: str, name: str) -> Any:
    """``value`` (from YAML or a ``--set`` string) as the type ``hint`` of ``section.name`` says:
    bool, int, float, str, one of a ``Literal``'s values, or None for an optional field."""

    def fail(reason: str) -> ConfigError:
        return ConfigError(section=section, field=name, value=value, reason=reason)

    if hint == WorkerCount:  # N or MIN-MAX: ScalingConfig parses and checks it
        return value
    if get_origin(hint) in (typing.Union, types.UnionType):  # X | None
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        hint = next(arg for arg in get_args(hint) if arg is not type(None))
    if get_origin(hint) is Literal:
        if isinstance(value, bool) and {"true", "false"} <= set(get_args(hint)):
            value = "true" if value else "false"  # YAML's true/false for a choice of words
        elif isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower()
        if value not in get_args(hint):
            raise fail(f"valid: {', '.join(map(str, get_args(hint)))}")
        return value
    if hint is bool:
        word = _BOOL_WORDS.get(value.lower()) if isinstance(value, str) else None
        if not isinstance(value, bool) and word is None:
            raise fail("expected True or False")
        return value if isinstance(value, bool) else word
    if hint in (int, float):
        reason = "expected an integer" if hint is int else "expected a number"
        # bool is an int; and int(2.5) would drop the .5 without a word.
        if isinstance(value, bool) or (hint is int and isinstance(value, float) and value % 1):
            raise fail(reason)
        try:
            return hint(value)
        except (TypeError, ValueError):
            raise fail(reason) from None
    return str(value) if hint is str else value


def apply_overrides(config: ConfigT, overrides: list[str]) -> ConfigT:
    """Apply ``section.field=value`` (or a unique bare ``field=value``) overrides.

    Returns a new, re-validated config; the input is not modified.
    """
    data = to_dict(config)
    if isinstance(config, ExperimentConfig):
        for data_field in DATA_FIELDS_DERIVED:  # derived again from their (maybe new) sources
            del data["data"][data_field]
    return from_dict(type(config), set_fields(data, overrides))


def override_text(value: Any) -> str:
    """A YAML value as ``--set`` text (lists become '1,2,2'; floats keep full precision)."""
    if isinstance(value, list | tuple):
        return ",".join(map(str, value))
    if isinstance(value, float):
        return repr(value)
    return str(value)


def set_fields(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``data`` (an experiment config's nested dict) with each ``field=value`` of ``overrides``
    set, the value converted to the field's type (:func:`coerce`); ``data`` is modified."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise UserInputError(f"override {item!r} must look like section.field=value")
        section, name = resolve_field(key)
        target = data.setdefault(section, {})
        if isinstance(target, dict):  # anything else: from_dict says the section is no mapping
            hint = field_type(section, name)
            target[name] = coerce(value.strip(), hint, section=section, name=name)
    return data


def resolve_field(key: str) -> tuple[str, str]:
    """``(section, field)`` of an :class:`ExperimentConfig` field named as ``--set`` takes it
    (``optim.lr`` or a unique bare name like ``lr``); unknown names raise a
    :class:`UserInputError` naming the valid ones."""
    key = key.strip()
    sections = _section_fields()
    if "." in key:
        section, _, name = key.partition(".")
        if section not in sections:
            raise UserInputError(
                f"unknown config section {section!r}; valid: {', '.join(sections)}"
            )
        if name not in sections[section]:
            valid = ", ".join(sections[section])
            raise UserInputError(f"unknown field {key!r}; valid {section} fields: {valid}")
        if section == "data" and name in DATA_FIELDS_DERIVED:
            source = DATA_FIELDS_DERIVED[name]
            raise UserInputError(f"{key} follows {source}; set {source} instead")
        return section, name
    owners = [s for s, names in sections.items() if key in names and _settable(s, key)]
    if len(owners) > 1:
        raise UserInputError(f"field {key!r} exists in {owners}; say which with section.field")
    if owners:
        return owners[0], key
    if key in FLAG_ALIASES:
        return FLAG_ALIASES[key]
    if key in FLAGS_ELSEWHERE:
        raise UserInputError(f"{key!r} is not a config field here: {FLAGS_ELSEWHERE[key]}")
    known = sorted(n for s, names in sections.items() for n in names if _settable(s, n))
    close = difflib.get_close_matches(key, known, n=3)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise UserInputError(
        f"unknown config field {key!r}{hint} (use section.field; sections: "
        f"{', '.join(sections)}; `raydiff train --help` and docs/training.md list the fields)"
    )


def field_type(section: str, name: str) -> Any:
    """The type hint of ``section.name`` in :class:`ExperimentConfig` (``float`` for ``optim.lr``)."""
    section_type = typing.get_type_hints(ExperimentConfig)[section]
    return typing.get_type_hints(section_type)[name]


def config_from_flags(flags: Mapping[str, Any]) -> ExperimentConfig:
    """Build a config from improved-diffusion style flat flags (e.g. a published model's flags).

    ``{"image_size": 64, "num_channels": 128, "learn_sigma": True, "noise_schedule": "cosine"}``
    """
    return apply_overrides(ExperimentConfig(), [f"{k}={v}" for k, v in flags.items()])


def _section_fields() -> dict[str, list[str]]:
    """``{section: [field, ...]}`` of an :class:`ExperimentConfig`."""
    hints = typing.get_type_hints(ExperimentConfig)
    return {
        f.name: [g.name for g in dataclasses.fields(hints[f.name])]
        for f in dataclasses.fields(ExperimentConfig)
    }


def _settable(section: str, name: str) -> bool:
    """Whether ``--set`` reaches ``section.name`` (a derived data field follows its source)."""
    return not (section == "data" and name in DATA_FIELDS_DERIVED)
