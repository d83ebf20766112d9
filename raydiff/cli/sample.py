"""``raydiff sample`` (``python jobs/sample.py``): check the request (the checkpoint included),
sample on Ray workers, write npz + PNGs + grid. Its options are
:class:`~raydiff.sample.options.SampleOptions`' flags."""

from __future__ import annotations

import argparse

from raydiff.cli.arguments import add_options, options_from_args

HELP = "generate samples from a checkpoint on Ray workers (npz + PNGs + grid)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of :class:`~raydiff.sample.options.SampleOptions` and ``--address``."""
    from raydiff.sample.options import SampleOptions

    add_options(parser, SampleOptions, address=True)


def run(args: argparse.Namespace) -> int:
    """Check the request, sample on Ray, say where the samples went."""
    from raydiff.orchestrate.sampling import run_sampling
    from raydiff.sample.options import SampleOptions

    options = options_from_args(SampleOptions, args)
    result = run_sampling(options, address=args.address)
    if result.base is not None:
        print(f"base model: {result.base.num_samples} samples in {result.base.seconds:.1f} s")
        print(f"npz:    {result.base.npz}")
        print("upsampled:")
    print(
        f"{result.num_samples} samples in {result.seconds:.1f} s "
        f"({result.samples_per_s:.2f} samples/s)"
    )
    print(f"npz:    {result.npz}")
    print(f"images: {result.png_dir}")
    print(f"grid:   {result.grid}")
    return 0
