"""``raydiff evaluate bpd|fid|accuracy`` (``python jobs/evaluate.py``): the full variational
bound in bits/dim over a split, FID/KID of samples (or the same in a classifier's features), or a
clean classifier's accuracy on labelled samples. Their options are
:class:`~raydiff.evaluate.options.BpdOptions`', :class:`~raydiff.evaluate.options.FidOptions`'
and :class:`~raydiff.evaluate.options.AccuracyOptions`' flags."""

from __future__ import annotations

import argparse
import dataclasses
import json

from raydiff.cli.arguments import add_options, options_from_args

HELP = "evaluate a checkpoint: bits/dim over a split, FID/KID or accuracy of samples"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One sub-command per metric, with the flags of its options."""
    from raydiff.evaluate.options import AccuracyOptions, BpdOptions, FidOptions

    metrics = parser.add_subparsers(dest="metric", required=True, metavar="METRIC")
    bpd = metrics.add_parser(
        "bpd",
        help="the full variational bound in bits/dim over a split (calc_bpd_loop on Ray workers)",
        description="The full variational bound (IDDPM eq. 5) in bits/dim, every term of it, "
        "over a split of the dataset, images spread over Ray workers. Results: JSON (printed), "
        "per-image terms (npz), and the run's trackers for a run's checkpoint.",
    )
    add_options(bpd, BpdOptions, address=True)
    fid = metrics.add_parser(
        "fid",
        help="FID, KID, precision and recall of samples against a reference (Inception weights "
        "from a local file)",
        description="FID, KID and improved precision and recall (k = 3) between samples (a "
        "`raydiff sample` folder or npz, or an image folder) and a reference (a prepared "
        "dataset's split, an npz or an image folder), with the standard FID Inception network "
        "(torch-fidelity's) read from a local weights file, or (--features) in the penultimate "
        "features of a clean raydiff classifier. A prepared dataset's reference features are "
        "cached next to it.",
    )
    add_options(fid, FidOptions)
    accuracy = metrics.add_parser(
        "accuracy",
        help="a clean classifier's accuracy on labelled samples (or on a dataset split)",
        description="The fraction of labelled images (a sample npz's arr_1, or a prepared "
        "dataset's labels) that a clean raydiff classifier classifies as their label.",
    )
    add_options(accuracy, AccuracyOptions)


def run(args: argparse.Namespace) -> int:
    """Compute (bits/dim on Ray workers, FID/KID or accuracy in this process), print the JSON,
    say where it went."""
    from raydiff.evaluate.options import AccuracyOptions, BpdOptions, FidOptions

    if args.metric == "bpd":
        from raydiff.orchestrate.model_actor import run_bpd

        result = run_bpd(options_from_args(BpdOptions, args), address=args.address)
    else:
        from raydiff.evaluate.accuracy import run_accuracy
        from raydiff.evaluate.samples_fid import run_fid

        evaluate, options_type = {
            "fid": (run_fid, FidOptions),
            "accuracy": (run_accuracy, AccuracyOptions),
        }[args.metric]
        options = options_from_args(options_type, args)
        result = evaluate(**{f.name: getattr(options, f.name) for f in dataclasses.fields(options)})
    summary = result.summary
    print(json.dumps(summary, indent=2))
    if args.metric == "bpd":
        print(
            f"{summary['split']}: {summary['bpd']:.4f} +- {summary['bpd_stderr']:.4f} bits/dim "
            f"({summary['num_images']} images, {result.seconds:.0f} s)"
        )
    elif args.metric == "accuracy":
        print(f"accuracy {summary['accuracy']:.4f} on {summary['num_images']} images")
    print(f"results: {result.json_path}")
    if args.metric == "bpd":
        print(f"terms:   {result.terms_path}")
    for line in result.tracked:
        print(line)
    return 0
