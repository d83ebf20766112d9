"""The ``raydiff`` command: one sub-command per module of :mod:`raydiff.cli`, the entry point,
and how a user's mistake is shown.

Each command module has ``HELP``, ``add_arguments`` (its options' flags, built from their
dataclasses by :mod:`raydiff.cli.arguments`) and ``run`` (the parsed arguments -> typed options
or config -> one library function). Heavy imports (Ray, torch) happen inside ``run``, so
``raydiff --help`` and ``raydiff prepare`` start quickly.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from raydiff.cli import (
    ema,
    evaluate,
    family,
    prepare,
    sample,
    sweep,
    train,
    train_classifier,
)
from raydiff.cli.arguments import flag_of
from raydiff.cli.exit_codes import (
    EXIT_INTERRUPTED,
    EXIT_RUN_FAILED,
    EXIT_TERMINATED,
    EXIT_USER_ERROR,
)
from raydiff.errors import ConfigError, RunFailedError, RunInterruptedError, UserInputError
from raydiff.orchestrate.driver_signals import StopSignal, sigterm_as_ctrl_c
from raydiff.orchestrate.ray_session import skip_ray_noise

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Subcommand:
    """One ``raydiff`` subcommand."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


SUBCOMMANDS: dict[str, Subcommand] = {
    module.__name__.rpartition(".")[2].replace("_", "-"): Subcommand(
        help=module.HELP, add_arguments=module.add_arguments, run=module.run
    )
    for module in (prepare, train, train_classifier, sample, evaluate, sweep, ema, family)
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per entry of ``SUBCOMMANDS``."""
    parser = argparse.ArgumentParser(
        prog="raydiff", description="Diffusion models (IDDPM / ADM) on Ray."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, subcommand in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=subcommand.help, description=subcommand.help)
        subcommand.add_arguments(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point (``raydiff = raydiff.cli:main``); returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    skip_ray_noise()  # before any command imports Ray, which reads it then
    stopped = StopSignal()  # replaced by the one of the block below
    try:
        # Until a command joins Ray (whose ray.init installs a handler of its own; the commands
        # wrap what they wait on in Ray the same way), SIGTERM stops it as Ctrl-C does.
        with sigterm_as_ctrl_c() as stopped:
            return SUBCOMMANDS[args.command].run(args)
    except (UserInputError, FileNotFoundError, FileExistsError) as error:
        # User mistakes get one clear line, not a traceback (use -v for the traceback). Anything
        # else (a plain ValueError from torch included) is a bug and keeps its traceback.
        logger.debug("details", exc_info=True)
        message = render_error(error, args)
        print(f"raydiff {args.command}: error: {message}", file=sys.stderr)
        return EXIT_USER_ERROR
    except RunFailedError as error:
        # Not the user's mistake, but their next step is in the message (Ray's error: -v).
        logger.debug("details", exc_info=True)
        print(f"raydiff {args.command}: error: {error}", file=sys.stderr)
        return EXIT_RUN_FAILED
    except RunInterruptedError as error:
        print(f"raydiff {args.command}: {error}", file=sys.stderr)
        return EXIT_TERMINATED if error.signal_name == "SIGTERM" else EXIT_INTERRUPTED
    except KeyboardInterrupt:  # stopped where nothing says more than this (no traceback)
        logger.debug("details", exc_info=True)
        print(f"raydiff {args.command}: stopped by {stopped.described}", file=sys.stderr)
        return EXIT_TERMINATED if stopped.sigterm else EXIT_INTERRUPTED


def render_error(error: Exception, args: argparse.Namespace) -> str:
    """The message of a user's mistake; a ``ConfigError`` names the flag that gave the value,
    where one did (:func:`~raydiff.cli.arguments.flag_of`)."""
    if isinstance(error, ConfigError):
        return error.render(flag_of(error, args))
    return str(error)
