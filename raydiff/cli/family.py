"""``raydiff family FILE --output DIR`` (``python jobs/family.py``): guided-diffusion's family of
models (base, noisy classifier, upsampler, clean evaluator) trained together on one Ray cluster,
then the guided cascade sampled and judged (:mod:`raydiff.orchestrate.family`); running it again
continues."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from raydiff.cli.arguments import add_options, options_from_args
from raydiff.errors import ConfigError
from raydiff.flags import flag

HELP = "train a family (base, classifier, upsampler, evaluator) at once, then judge its samples"


@dataclass(kw_only=True)
class FamilyOptions:
    """What ``raydiff family`` was asked for."""

    section = "family"

    file: str = flag(
        "FILE",
        help="family file (YAML; docs/family.md), or a shipped one's name (family_demo)",
    )
    output: str = flag(
        "--output",
        help="the family's folder, a local path or a URI pyarrow reads (s3://bucket/family): "
        "DIR/<stage>/, DIR/logs/, DIR/report.md",
    )
    overrides: list[str] = flag(
        "--set",
        default_factory=list,
        action="append",
        metavar="STAGE.FIELD=VALUE",
        help="override a stage's field: base.lr=1e-3 (FIELD as raydiff train --set takes it), "
        "sample.num_samples=64; repeatable",
    )
    max_steps: int | None = flag(
        "--max-steps",
        default=None,
        help="cap every training stage's train.max_steps (a quick trial of a family file)",
    )

    def __post_init__(self) -> None:
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(
                section=self.section, field="max_steps", value=self.max_steps, reason="must be >= 1"
            )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of :class:`FamilyOptions` and ``--address``."""
    add_options(parser, FamilyOptions, address=True)


def run(args: argparse.Namespace) -> int:
    """Check the family, run its stages, print where the report is."""
    from raydiff.orchestrate.family import run_family

    options = options_from_args(FamilyOptions, args)
    report = run_family(
        options.file,
        overrides=options.overrides,
        max_steps=options.max_steps,
        output=options.output,
        address=args.address,
    )
    print(report.read_text())
    return 0
