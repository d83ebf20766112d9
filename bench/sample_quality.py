"""Sample quality of a checkpoint on this machine: Fréchet distance, precision and recall in a
clean raydiff classifier's features, and that evaluator's accuracy on the samples' labels, for
several samplers and guidance scales. The tables of docs/results.md come from it.

For each sampler setting (``--samplers``: ``N`` ancestral on N respaced steps, ``ddimN`` DDIM)
and each guidance scale (``--scales``, with ``--classifier``; scale 0 is unguided), it draws
``--num-samples`` samples with ``raydiff sample``'s code on Ray actors (seed 0: every setting
starts from the same noise), then runs ``raydiff evaluate fid --features EVALUATOR`` against the
test split and, when the samples have labels (a class-conditional or guided model),
``raydiff evaluate accuracy``. Every sample folder stays under ``--out`` for inspection.

    python bench/sample_quality.py --checkpoint runs/demo/checkpoint_000450 \\
        --evaluator runs/evaluator_demo/checkpoint_002000 --samplers 1000,250,50,ddim25
    python bench/sample_quality.py --checkpoint runs/demo_cond/checkpoint_000450 \\
        --evaluator runs/evaluator_demo/checkpoint_002000 --samplers 50 \\
        --classifier runs/classifier_demo/checkpoint_001200 --scales 0,1,2,4,8

With ``--precisions fp32,bf16`` every setting is drawn in each precision (``raydiff sample
--precision``; the same seed, so sample i of one precision is sample i of the other but for the
model's rounding), and each row after the first precision's also gives the mean absolute pixel
difference (levels of 255) from that first precision's samples:

    python bench/sample_quality.py --checkpoint runs/demo/checkpoint_000450 \
        --evaluator runs/evaluator_demo/checkpoint_002000 --samplers ddim25 \
        --precisions fp32,bf16

Prints one markdown table row per setting and writes them all to ``--out/results.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np


def evaluate_setting(
    args: argparse.Namespace, sampler: str, scale: float | None, precision: str = "auto"
) -> dict[str, Any]:
    """Sample one setting and measure it."""
    from raydiff.evaluate.accuracy import run_accuracy
    from raydiff.evaluate.samples_fid import run_fid
    from raydiff.orchestrate.sampling import run_sampling
    from raydiff.sample.options import SampleOptions

    ddim = sampler.startswith("ddim")
    name = f"{sampler}" + (f"_scale{scale:g}" if scale is not None else "")
    name += f"_{precision}" if args.precisions != "auto" else ""
    guided = scale is not None and scale > 0
    options = SampleOptions(
        checkpoint=args.checkpoint,
        num_samples=args.num_samples,
        out=str(args.out / name),
        timestep_respacing=sampler,
        use_ddim=ddim,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        seed=0,
        classifier=args.classifier if guided else None,
        classifier_scale=scale if guided else 1.0,
        precision=precision,
        use_gpu=args.use_gpu,
    )
    started = time.perf_counter()
    sampled = run_sampling(options)
    sample_seconds = time.perf_counter() - started
    fd = run_fid(
        samples=str(args.out / name),
        reference=args.reference,
        split=args.split,
        features=args.evaluator,
    ).summary
    record = json.loads((args.out / name / "sampling.json").read_text())
    row: dict[str, Any] = {
        "sampler": sampler,
        "scale": scale,
        "precision": record["precision"],  # resolved (auto: fp32 on a CPU)
        "npz": str(sampled.npz),
        "num_samples": args.num_samples,
        "samples_per_s": sampled.samples_per_s,
        "sample_seconds": sample_seconds,
        **{k: fd[k] for k in ("fd_classifier", "precision_classifier", "recall_classifier")},
    }
    with np.load(sampled.npz) as data:
        labelled = "arr_1" in data.files
    if labelled:
        accuracy = run_accuracy(samples=str(args.out / name), classifier=args.evaluator)
        row["accuracy"] = accuracy.summary["accuracy"]
    return row


def pixel_difference(npz: str, reference_npz: str) -> float:
    """Mean absolute difference of two sample sets' pixels, in levels of 255."""
    with np.load(npz) as a, np.load(reference_npz) as b:
        return float(np.abs(a["arr_0"].astype(int) - b["arr_0"].astype(int)).mean())


def format_row(row: dict[str, Any], *, precisions: bool) -> str:
    scale = "" if row["scale"] is None else f" | {row['scale']:g}"
    precision = f" | {row['precision']}" if precisions else ""
    accuracy = f"{row['accuracy']:.3f}" if "accuracy" in row else "-"
    difference = row.get("pixel_difference")
    versus = "" if not precisions else " | -" if difference is None else f" | {difference:.2f}"
    return (
        f"| {row['sampler']}{scale}{precision} | {row['fd_classifier']:.2f} | "
        f"{row['precision_classifier']:.3f} | {row['recall_classifier']:.3f} | {accuracy} | "
        f"{row['samples_per_s']:.2f}{versus} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="the diffusion checkpoint")
    parser.add_argument("--evaluator", required=True, help="a clean classifier checkpoint")
    parser.add_argument("--samplers", default="50", help="comma-separated: N or ddimN")
    parser.add_argument("--classifier", default=None, help="the noisy classifier that guides")
    parser.add_argument("--scales", default=None, help="guidance scales, e.g. 0,1,2,4,8")
    parser.add_argument(
        "--precisions", default="auto", help="raydiff sample --precision values, e.g. fp32,bf16"
    )
    parser.add_argument("--num-samples", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--use-gpu", action="store_true", help="one GPU per sampling worker")
    parser.add_argument("--reference", default="data/fashion-mnist", help="prepared dataset")
    parser.add_argument("--split", default="test")
    parser.add_argument("--out", type=Path, default=Path("runs/sample_quality"))
    args = parser.parse_args()
    if (args.scales is None) != (args.classifier is None):
        parser.error("--scales and --classifier go together")
    scales = [float(s) for s in args.scales.split(",")] if args.scales else [None]
    if args.out.exists() and any(args.out.iterdir()):
        parser.error(f"--out {args.out} is not empty")
    rows = []
    precisions = args.precisions.split(",")
    several = args.precisions != "auto"
    header = (
        "| sampler"
        + (" | scale" if args.scales else "")
        + (" | model precision" if several else "")
    )
    header += " | FD (classifier) | precision | recall | accuracy | samples/s |"
    print(header + (f" mean abs pixel difference from {precisions[0]} |" if several else ""))
    for sampler in args.samplers.split(","):
        for scale in scales:
            first = None
            for precision in precisions:
                rows.append(evaluate_setting(args, sampler, scale, precision))
                if first is not None:
                    rows[-1]["pixel_difference"] = pixel_difference(rows[-1]["npz"], first["npz"])
                first = first or rows[-1]
                print(format_row(rows[-1], precisions=several), flush=True)
    (args.out / "results.json").write_text(
        json.dumps(
            {"arguments": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2
        )
    )


if __name__ == "__main__":
    main()
