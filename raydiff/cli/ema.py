"""``raydiff ema`` (``python jobs/ema.py``): EMA weights of any length from a run's post-hoc EMA
snapshots, written into one of its checkpoints; with ``--evaluate``, a sweep that evaluates and
ranks them (:mod:`raydiff.orchestrate.ema_sweep`). Its options are
:class:`~raydiff.ema.reconstruction.EmaOptions`' flags."""

from __future__ import annotations

import argparse

from raydiff.cli.arguments import add_options, options_from_args, read_options_file

HELP = "reconstruct EMA weights of any length from a run's post-hoc EMA snapshots"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of :class:`~raydiff.ema.reconstruction.EmaOptions`."""
    from raydiff.ema.reconstruction import EmaOptions

    add_options(parser, EmaOptions)


def run(args: argparse.Namespace) -> int:
    """Reconstruct, write, and say what each file is and how to use it; with ``--evaluate``,
    evaluate every length and print the table ranking them."""
    from raydiff.ema.reconstruction import EmaOptions, reconstruct_ema

    from_file = read_options_file(args.config, EmaOptions) if args.config else None
    options = options_from_args(EmaOptions, args, file_values=from_file)
    if options.evaluate:
        from raydiff.orchestrate.ema_sweep import run_ema_sweep

        written, report = run_ema_sweep(options)
    else:
        written, report = reconstruct_ema(options), None
    for item in written:
        origin = f" (--rate {item.rate})" if item.rate is not None else ""
        print(
            f"{item.name}{origin}: sigma_rel {item.sigma_rel:.4f}, reconstruction error "
            f"{item.error:.1e} -> {item.path}"
        )
    checkpoint = written[0].path.parent
    if report is None:
        print(f"use: raydiff sample --checkpoint {checkpoint} --weights {written[0].name} ...")
        return 0
    print(report.table)
    print(f"table: {report.csv}\nplot: {report.plot}")
    if report.best is not None:
        print(f"use: raydiff sample --checkpoint {checkpoint} --weights {report.best.name} ...")
    return 0
