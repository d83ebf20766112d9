"""The ``raydiff`` command line: ``raydiff SUBCOMMAND ...`` (same as ``python jobs/SUBCOMMAND.py``).

One module per command (:mod:`~raydiff.cli.prepare`, :mod:`~raydiff.cli.train`,
:mod:`~raydiff.cli.sweep`, :mod:`~raydiff.cli.sample`, :mod:`~raydiff.cli.evaluate`); what they
share: the parser built from option dataclasses (:mod:`~raydiff.cli.arguments`), the entry point
and the error rendering (:mod:`~raydiff.cli.app`), the exit codes.
"""

from raydiff.cli.app import build_parser, main, render_error

__all__ = ["build_parser", "main", "render_error"]
