"""``argparse`` arguments built from option dataclasses, and the options built back from them.

Each option is declared once, on its dataclass field (:func:`raydiff.flags.flag`): its flag, its
help, and its type from the field's type hint. :func:`add_options` adds a dataclass's flags to a
parser, :func:`options_from_args` builds the dataclass from the parsed arguments (the dataclass
validates itself), and :func:`flag_of` finds the flag behind a refused value, so the error names
what the user typed.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

from raydiff.errors import ConfigError, UserInputError
from raydiff.flags import MISSING

OptionsT = TypeVar("OptionsT")


def add_options(
    parser: argparse.ArgumentParser, options_type: type, *, address: bool = False
) -> None:
    """Add an argument for every field of ``options_type`` that declares a flag; the parsed
    arguments remember ``options_type`` (as ``options_type``) for :func:`flag_of`. ``address``:
    also ``--address``, the Ray cluster to run on (train, sweep, sample, evaluate bpd): where a
    command runs, not what it computes, so no options dataclass holds it."""
    hints = typing.get_type_hints(options_type)
    for f in _flag_fields(options_type):
        meta = f.metadata
        kwargs: dict[str, Any] = {"help": meta["help"], **meta["argparse"]}
        default = _argument_default(f)
        if meta["from_arg"] is None and not {"action", "type"} & set(kwargs):
            for key, value in _kind_of(_without_none(hints[f.name]), default).items():
                kwargs.setdefault(key, value)
        if not meta["flag"].startswith("-"):  # positional: required, shown as its metavar
            parser.add_argument(f.name, metavar=meta["flag"], **kwargs)
            continue
        if kwargs.get("action") in (None, "append") and "choices" not in kwargs:  # a value
            kwargs.setdefault("metavar", meta["flag"].lstrip("-").replace("-", "_").upper())
        if default is MISSING:
            kwargs["required"] = True
        else:
            kwargs["default"] = default
        parser.add_argument(meta["flag"], dest=f.name, **kwargs)
    parser.set_defaults(options_type=options_type)
    if address:
        parser.add_argument(
            "--address",
            default=None,
            help="Ray cluster to run on: 'auto' (the one `ray start` runs on this machine), "
            "HOST:PORT or ray://HOST:PORT (default: $RAY_ADDRESS, else a new local instance)",
        )


def options_from_args(
    options_type: type[OptionsT],
    args: argparse.Namespace,
    *,
    file_values: Mapping[str, Any] | None = None,
) -> OptionsT:
    """``options_type`` built from the parsed arguments of its flags (other fields keep their
    defaults); a ``from_arg`` conversion that fails is a :class:`ConfigError` of that field.

    ``file_values`` (:func:`read_options_file`) fill the options the command line leaves at
    their defaults: a flag typed with another value wins over the file."""
    kwargs = {}
    for f in _flag_fields(options_type):
        value = getattr(args, f.name)
        convert = f.metadata["from_arg"]
        if file_values and f.name in file_values and value == _argument_default(f):
            value = file_values[f.name]
            if convert is not None:  # the flag's text: a list is comma-separated values
                from raydiff.config import override_text

                value = override_text(value)
        if convert is not None:
            try:
                value = convert(value)
            except ValueError as err:
                section = getattr(options_type, "section", options_type.__name__)
                raise ConfigError(
                    section=section, field=f.name, value=value, reason=str(err)
                ) from None
        kwargs[f.name] = value
    return options_type(**kwargs)


def read_options_file(path: str, options_type: type) -> dict[str, Any]:
    """A YAML file of ``options_type``'s options, keyed by field name (``sigma_rel``, or its
    flag's name, ``sigma-rel``), read as every file is (:func:`~raydiff.config.field_values`);
    an option its flag converts takes the flag's text, or a list of comma-separated values."""
    from raydiff.config import field_values
    from raydiff.config.presets import read_yaml_mapping

    file = Path(path)
    if not file.is_file():
        raise UserInputError(f"--config {path}: no such file")
    data = read_yaml_mapping(file, what=f"--config {path}", holds="options")
    named = {str(key).replace("-", "_"): value for key, value in data.items()}
    return field_values(options_type, named, where=f"--config {path}")


def flag_of(error: ConfigError, args: argparse.Namespace) -> str | None:
    """The flag that gave the value ``error`` refuses, or None (a config file or ``--set`` gave
    it, or it is no option of this command): a field of the command's options (the options'
    ``section``), or a config field that one of its flags ``sets`` when the user typed that flag."""
    options_type = getattr(args, "options_type", None)
    if options_type is None:
        return None
    own = error.section == getattr(options_type, "section", None)
    for f in _flag_fields(options_type):
        meta = f.metadata
        if own and f.name == error.field:
            return meta["shown_as"]
        value = getattr(args, f.name, None)
        typed = value is not None and value is not False  # 0 is a value the user typed
        if meta["sets"] == f"{error.section}.{error.field}" and typed:
            return meta["flag"]
    return None


def set_by_flags(options: Any) -> list[str]:
    """``--set`` items for the options' flags that set a config field (``sets``) and were given:
    ``--max-steps 20`` is ``train.max_steps=20``."""
    items = []
    for f in _flag_fields(type(options)):
        value = getattr(options, f.name)
        if f.metadata["sets"] and value is not None and value is not False:
            shown = str(value).lower() if isinstance(value, bool) else value
            items.append(f"{f.metadata['sets']}={shown}")
    return items


def _flag_fields(options_type: type) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(options_type) if "flag" in f.metadata]


def _argument_default(f: dataclasses.Field[Any]) -> Any:
    if f.metadata["arg_default"] is not MISSING:
        return f.metadata["arg_default"]
    if f.default_factory is not MISSING:
        return f.default_factory()
    return f.default


def _without_none(hint: Any) -> Any:
    """``X`` of an optional ``X | None``."""
    if get_origin(hint) in (typing.Union, types.UnionType):
        return next(arg for arg in get_args(hint) if arg is not type(None))
    return hint


def _kind_of(hint: Any, default: Any) -> dict[str, Any]:
    """The ``add_argument`` keywords a field's type implies: a switch for a bool (``--no-X``
    too when it defaults to on), the choices of a ``Literal``, ``type`` for numbers."""
    if hint is bool:
        return {"action": argparse.BooleanOptionalAction if default is True else "store_true"}
    if get_origin(hint) is Literal:
        return {"choices": get_args(hint)}
    if hint in (int, float):
        return {"type": hint}
    return {}
