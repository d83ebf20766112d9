"""Command-line flags declared on the option dataclasses they fill.

A field made with :func:`flag` carries its flag and help in ``dataclasses.field(metadata=...)``;
the command line (:mod:`raydiff.cli.arguments`) builds its ``argparse`` arguments from them, fills
the dataclass from the parsed arguments, and names the flag when the field's value is refused.
Each option is declared once, here on its field; a command whose options include another
command's (``raydiff ema --evaluate``: FID's and bits/dim's) takes them with :func:`included`. Like :mod:`raydiff.errors`, this module imports
nothing else of raydiff, so any layer's options may use it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

MISSING: Any = dataclasses.MISSING


def flag(
    name: str,
    *,
    help: str,
    default: Any = MISSING,
    default_factory: Callable[[], Any] | Any = MISSING,
    sets: str | None = None,
    from_arg: Callable[[Any], Any] | None = None,
    arg_default: Any = MISSING,
    shown_as: str | None = None,
    **argparse_kwargs: Any,
) -> Any:
    """A dataclass field that is also the command-line flag ``name``.

    ``name`` is ``--flag``, or an upper-case metavar for a positional argument. ``help`` and any
    ``argparse_kwargs`` (``choices``, ``action``, ``metavar``, ...) go to ``add_argument``;
    ``type`` and ``choices`` follow the field's type hint unless given. A field without a default
    is a required flag. Options of a command that only set a config field name it in ``sets``
    (``"train.max_steps"``), so a refused value names the flag. ``from_arg`` converts the parsed
    argument to the field's value (its ``ValueError`` is a refused value); then ``arg_default``
    is the argument's default and ``shown_as`` the name an error gives the field's value.
    """
    metadata = {
        "flag": name,
        "help": help,
        "sets": sets,
        "from_arg": from_arg,
        "arg_default": arg_default,
        "shown_as": shown_as or name,
        "argparse": argparse_kwargs,
    }
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def included(options_type: type, field: str, *, context: str, **changes: Any) -> Any:
    """The option ``field`` of another options dataclass, ``options_type``, as a field of this one:
    its flag, type conversion, default and help, the help after ``context`` (when the option
    applies here); ``changes`` replace any of :func:`flag`'s arguments (``name`` renames the
    flag, ``default``, ``help``)."""
    source = next(f for f in dataclasses.fields(options_type) if f.name == field)
    meta = source.metadata
    arguments = {
        "name": meta["flag"],
        "help": meta["help"],
        "default": source.default,
        "default_factory": source.default_factory,
        "sets": meta["sets"],
        "from_arg": meta["from_arg"],
        "arg_default": meta["arg_default"],
        **meta["argparse"],
    } | changes
    return flag(**{**arguments, "help": f"{context}: {arguments['help']}"})
