"""Errors that describe a user's mistake, as opposed to a bug.

The command line prints a :class:`UserInputError` as one line, without a traceback; any other
exception is a bug (or a failure outside the user's hands) and keeps its traceback. Both are
``ValueError`` subclasses, so code that catches ``ValueError`` keeps working. A
:class:`RunFailedError` (a run that recovery gave up on) and a :class:`RunInterruptedError`
(Ctrl-C) are printed as their message too.

This module imports nothing else of raydiff (nor torch or Ray): every layer may raise these.
"""

from __future__ import annotations

import functools
import re

# A line that names a raised exception: "ValueError: ...", "ray.exceptions.ActorDiedError: ...",
# "RayTaskError(ValueError): ...".
_RAISED_LINE = re.compile(r"^[\w.]*(?:Error|Exception|Exit|Interrupt)(?:\([\w.]*\))?:")


class UserInputError(ValueError):
    """A mistake in what the user gave (flags, config, data, paths).

    The message is one actionable line: what is wrong and what to do instead.
    """


class ConfigError(UserInputError):
    """One invalid configuration value: ``section.field=value is invalid: reason``.

    ``section`` and ``field`` name where the value is set (``model.image_size``, or
    ``prepare.num_workers`` for an option of ``raydiff prepare``), so that a caller that knows
    another name for the field (a command-line flag) can :meth:`render` the error with it.
    """

    def __init__(self, *, section: str, field: str, value: object, reason: str) -> None:
        self.section = section
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{section}.{field}={value!r} is invalid: {reason}")

    def render(self, flag: str | None = None) -> str:
        """The message naming ``flag`` (``--workers 0 is invalid: ...``); ``str(self)`` without."""
        if flag is None:
            return str(self)
        return f"{flag} {self.value!r} is invalid: {self.reason}"

    def __reduce__(self) -> tuple[object, tuple[()]]:
        # Keyword-only arguments: the default (cls(*args)) cannot rebuild it. Ray pickles
        # exceptions raised in workers.
        rebuild = functools.partial(
            type(self), section=self.section, field=self.field, value=self.value, reason=self.reason
        )
        return rebuild, ()


class RunFailedError(RuntimeError):
    """A run stopped by failures outside the user's hands after automatic recovery gave up
    (Ray Train's ``scaling.max_failures`` restarts used up).

    The message says what failed, the last complete checkpoint the run left and how to continue;
    the original error is its ``__cause__`` (the command line shows it with ``-v``).
    """


class RunInterruptedError(RuntimeError):
    """The user stopped a run or a command's Ray work (Ctrl-C, or SIGTERM, which drivers turn
    into Ctrl-C); the message says where it stands and how to continue. ``signal_name``: the
    signal that stopped it."""

    def __init__(self, message: str, *, signal_name: str = "SIGINT") -> None:
        super().__init__(message)
        self.signal_name = signal_name


def first_line(error: BaseException | str, *, limit: int = 200) -> str:
    """``error`` (an exception or its message) as one short line, for messages that quote
    another error: the one rule for it.

    When the message names a raised exception on a later line (Ray's errors from worker
    processes and trials carry the whole traceback, which ends with ``SomeError: ...``), the last
    such line, which is what was raised; otherwise the first non-empty line. A trailing full stop
    is dropped (the caller's sentence goes on), an exception's empty message gives its type name
    (an empty message, ''), and the line is cut to ``limit`` characters.
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    raised = [line for line in lines[1:] if _RAISED_LINE.match(line)]
    text = (raised[-1] if raised else (lines[0] if lines else "")).rstrip(".")
    if not text and isinstance(error, BaseException):
        text = type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
