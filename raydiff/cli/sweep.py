"""``raydiff sweep`` (``python jobs/sweep.py``): check a sweep (every trial's config included),
run it on Ray Tune, print the results; or continue an interrupted one."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from raydiff.cli.arguments import (
    add_options,
    options_from_args,
    set_by_flags,
)
from raydiff.cli.exit_codes import EXIT_INTERRUPTED, EXIT_TERMINATED
from raydiff.errors import UserInputError
from raydiff.flags import flag

HELP = "sweep config fields with Ray Tune (one Ray Train run per trial, ASHA stopping)"


@dataclass(kw_only=True)
class SweepOptions:
    """What ``raydiff sweep`` was asked for: a new sweep (a sweep file, a folder and overrides
    of its base config) or an interrupted one to continue."""

    config: str | None = flag(
        "--config",
        default=None,
        help="sweep file (YAML: base config, search space, trials, scheduler; e.g. "
        "configs/sweep_demo.yaml, which docs/sweeps.md explains)",
    )
    output: str | None = flag("--output", default=None, help="sweep folder (must be new or empty)")
    overrides: list[str] = flag(
        "--set",
        default_factory=list,
        action="append",
        metavar="FIELD=VALUE",
        help="override a field of the base config for every trial (max_steps=20); repeatable",
    )
    num_workers: str | None = flag(
        "--num-workers",
        default=None,
        sets="scaling.num_workers",
        help="Ray Train workers per trial (sets scaling.num_workers): N, or MIN-MAX",
    )
    resume: str | None = flag(
        "--resume",
        default=None,
        metavar="DIR",
        help="continue the interrupted sweep in DIR (finished trials are not run again)",
    )

    def __post_init__(self) -> None:
        given = self.config or self.output or self.overrides or self.num_workers is not None
        if self.resume and given:
            raise UserInputError(
                "--resume DIR continues a sweep as it was started: give it alone (with "
                "--address at most)"
            )
        if not self.resume and not (self.config and self.output):
            raise UserInputError(
                "give --config SWEEP.yaml and --output DIR (or --resume DIR to continue a sweep)"
            )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of :class:`SweepOptions` and ``--address``."""
    add_options(parser, SweepOptions, address=True)


def run(args: argparse.Namespace) -> int:
    """Check the sweep (every trial's config included), run it on Ray Tune, print the results."""
    options = options_from_args(SweepOptions, args)
    if options.resume:
        from raydiff.orchestrate.sweep import resume_sweep

        outcome = resume_sweep(options.resume, address=args.address)
        folder = options.resume
    else:
        from raydiff.cli.train import manifest_preparing_demo
        from raydiff.orchestrate.sweep import start_sweep, sweep_folder
        from raydiff.sweep.spec import load_sweep

        assert options.config and options.output  # SweepOptions requires them without --resume
        folder = options.output
        sweep_folder("--output", folder)  # a URI is refused before the trials are checked
        overrides = [*options.overrides, *set_by_flags(options)]
        # Checked in full (every trial's config against the data) before Ray starts.
        loaded = load_sweep(
            options.config, overrides=overrides, manifest_for=manifest_preparing_demo
        )
        outcome = start_sweep(loaded, output_dir=folder, address=args.address)
    print(outcome.table)
    if outcome.interrupted:
        by = " by SIGTERM" if outcome.stopped_by == "SIGTERM" else ""
        print(f"sweep interrupted{by}; continue it with: raydiff sweep --resume {folder}")
        return EXIT_TERMINATED if outcome.stopped_by == "SIGTERM" else EXIT_INTERRUPTED
    print(f"results:       {outcome.results_csv}")
    if outcome.best_config:
        print(f"best config:   {outcome.best_config}")
    if outcome.best_checkpoint:
        print(f"best checkpoint: {outcome.best_checkpoint}")
    print(f"tensorboard:   tensorboard --logdir {outcome.tensorboard_dir}")
    return 0
