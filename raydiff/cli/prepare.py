"""``raydiff prepare`` (``python jobs/prepare.py``): an image collection -> Parquet shards +
manifest.json. Its options are :class:`~raydiff.data.prepare.PrepareOptions`' flags."""

from __future__ import annotations

import argparse
import logging

from raydiff.cli.arguments import add_options, options_from_args

HELP = "turn an image collection into Parquet shards + manifest.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of :class:`~raydiff.data.prepare.PrepareOptions`."""
    from raydiff.data.prepare import PrepareOptions

    add_options(parser, PrepareOptions)


def run(args: argparse.Namespace) -> int:
    """Build ``PrepareOptions`` from the arguments and run prepare (an invalid option raises a
    ConfigError that names its flag)."""
    from raydiff.data.prepare import PrepareOptions, prepare_dataset

    options = options_from_args(PrepareOptions, args)
    if not options.progress and not args.verbose:  # --quiet: warnings only
        logging.getLogger().setLevel(logging.WARNING)
    # SIGTERM stops it as Ctrl-C does (raydiff.cli.app): `finally` blocks remove the temporary
    # output on the way out.
    summary = prepare_dataset(options)
    if options.progress:
        print(summary.format())
    return 0
