"""Sampling speed: samples/s of ``raydiff sample`` for 1000-step ancestral, respaced 250 and
DDIM 50 sampling of the demo model, on 1 and 2 workers (one thread each).

Targets (issue: sampling and evaluation): DDIM 50 at least 15x faster per image than 1000-step
ancestral; 2 workers at least 1.7x the samples/s of 1 worker.

Each case runs ``raydiff.orchestrate.sampling.run_sampling`` on one local Ray instance (started
once, ``RAY_AUTH_MODE=disabled``) and takes its own figure: samples over the seconds from the
first batch submitted to the last one back. That includes the actors' start-up (a new process
importing torch and building the model, a few seconds), so the default sample counts keep each
case long against it. ``--checkpoint`` defaults to the newest
checkpoint of ``runs/demo`` (``make demo``). Prints a table and writes
``bench/results/sampling.json``.

``--gpu``: instead, DDIM-50 and 250-step ancestral samples/s on one CUDA GPU in one process,
raydiff's sampler against improved-diffusion's sampling loops (bench/sampling_gpu.py, whose
options follow ``--gpu``: ``bench/sampling.py --gpu --help``; ``make bench-sampling-gpu``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CASES = {
    "ancestral-1000": {"timestep_respacing": "", "use_ddim": False},
    "respaced-250": {"timestep_respacing": "250", "use_ddim": False},
    "ddim-50": {"timestep_respacing": "ddim50", "use_ddim": True},
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--gpu" in argv:
        sys.path.insert(0, str(REPO / "bench"))
        from sampling_gpu import main as gpu_main

        gpu_main([arg for arg in argv if arg != "--gpu"])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="the one-process GPU benchmark against improved-diffusion instead "
        "(bench/sampling_gpu.py; its options: --gpu --help)",
    )
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument(
        "--cases", default=",".join(CASES), help="comma-separated: " + ",".join(CASES)
    )
    parser.add_argument("--workers", default="1,2")
    parser.add_argument(
        "--num-samples",
        default="ancestral-1000=8,respaced-250=16,ddim-50=64",
        help="samples per case, CASE=N,...",
    )
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args(argv)

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from raydiff.orchestrate.ray_session import start_local_ray
    from raydiff.orchestrate.sampling import run_sampling
    from raydiff.sample.options import SampleOptions
    from raydiff.train.checkpoint import latest_checkpoint

    checkpoint = args.checkpoint or latest_checkpoint(REPO / "runs" / "demo")
    if checkpoint is None:
        raise SystemExit("no checkpoint: run `make demo` first or pass --checkpoint")
    counts = dict(item.split("=") for item in args.num_samples.split(","))
    workers = [int(w) for w in args.workers.split(",")]
    start_local_ray(num_cpus=max(workers) + 2, include_dashboard=False)
    rows = []
    for case in args.cases.split(","):
        for n in workers:
            out = Path(tempfile.mkdtemp(prefix="raydiff-sampling-bench-")) / "out"
            result = run_sampling(
                SampleOptions(
                    checkpoint=str(checkpoint),
                    num_samples=int(counts[case]),
                    out=str(out),
                    batch_size=args.batch_size,
                    num_workers=n,
                    **CASES[case],
                )
            )
            rows.append(
                {
                    "case": case,
                    "workers": n,
                    "num_samples": result.num_samples,
                    "seconds": result.seconds,
                    "samples_per_s": result.samples_per_s,
                }
            )
            print(
                f"{case:<15} {n} worker(s)  {result.num_samples:>4} samples  "
                f"{result.seconds:7.1f} s  {result.samples_per_s:7.3f} samples/s",
                flush=True,
            )
    by = {(r["case"], r["workers"]): r["samples_per_s"] for r in rows}
    for n in workers:
        if ("ddim-50", n) in by and ("ancestral-1000", n) in by:
            print(
                f"DDIM 50 vs 1000-step ancestral, {n} worker(s): "
                f"{by['ddim-50', n] / by['ancestral-1000', n]:.1f}x per image"
            )
    for case in CASES:
        if (case, 1) in by and (case, 2) in by:
            print(f"{case}: 2 workers vs 1: {by[case, 2] / by[case, 1]:.2f}x")
    path = REPO / "bench" / "results" / "sampling.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"checkpoint": str(checkpoint), "rows": rows}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
