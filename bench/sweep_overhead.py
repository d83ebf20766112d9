"""Sweep overhead: seconds from a trial's start to its first training step, and the share of
training steps ASHA saved against running every trial to the end.

Either runs a sweep (default: ``configs/sweep_demo.yaml``; ``--set`` overrides its base config,
e.g. ``--set max_steps=100``) into a temporary folder, or, with ``--sweep-dir DIR``, measures a sweep that already
ran (``make sweep`` leaves ``runs/sweep_demo``).

* start-up: ``trials/<trial>/trial.json``'s ``started`` (the wall time the trial function began,
  written by the trial itself before it starts its Ray Train run) to the wall time of step 1 in
  the trial's own TensorBoard scalar ``train/loss_step`` (stamped when the step ends). It covers
  the Ray Train controller and worker group start, the Ray Data pipeline (the first batch
  included), the model build and one training step. Target: under 15 s here. Also shown: the
  same from ``process_started``, when Tune's trial process was created (Linux): that adds the
  trial process's own start (Python, Ray, Tune's trainable, the trial's config).
* steps saved: each trial's last trained step (the highest step in ``train/loss_step``; an
  early-stopped trial trains on for a few steps between its last evaluation and being stopped)
  summed over trials, against trials x ``train.max_steps``.

Prints one line per trial and the summary, and writes ``bench/results/sweep_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def loss_steps(run_dir: Path) -> list[tuple[int, float]]:
    """(step, wall time) of every ``train/loss_step`` event of a training run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not (run_dir / "tensorboard").is_dir():  # a trial that failed before its first step
        return []
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    if "train/loss_step" not in acc.Tags().get("scalars", []):
        return []
    return [(e.step, e.wall_time) for e in acc.Scalars("train/loss_step")]


def measure(sweep_dir: Path) -> dict:
    """Per-trial start-up and trained steps of the sweep in ``sweep_dir``."""
    from raydiff.sweep.spec import load_sweep

    max_steps = load_sweep(sweep_dir / "sweep.yaml").max_steps
    trials = []
    for run_dir in sorted((sweep_dir / "trials").iterdir()):
        info_file = run_dir / "trial.json"
        events = loss_steps(run_dir)
        if not info_file.is_file() or not events:
            continue
        info = json.loads(info_file.read_text())
        first = min((wall for step, wall in events if step == 1), default=None)
        process_started = info.get("process_started")
        trials.append(
            {
                "trial": run_dir.name,
                "startup_s": None if first is None else first - info["started"],
                "startup_from_process_s": (
                    None if first is None or process_started is None else first - process_started
                ),
                "steps_trained": max(step for step, _ in events),
            }
        )
    startups = [t["startup_s"] for t in trials if t["startup_s"] is not None]
    from_process = [
        t["startup_from_process_s"] for t in trials if t["startup_from_process_s"] is not None
    ]
    trained = sum(t["steps_trained"] for t in trials)
    full = len(trials) * max_steps
    return {
        "sweep_dir": str(sweep_dir),
        "max_steps": max_steps,
        "trials": trials,
        "startup_s_median": statistics.median(startups) if startups else None,
        "startup_s_max": max(startups) if startups else None,
        "startup_from_process_s_median": statistics.median(from_process) if from_process else None,
        "steps_trained": trained,
        "steps_without_early_stopping": full,
        "fraction_saved": 1 - trained / full if full else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep-dir", type=Path, help="measure this finished sweep instead")
    parser.add_argument("--config", default=str(REPO / "configs" / "sweep_demo.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()

    sweep_dir = args.sweep_dir
    if sweep_dir is None:
        from raydiff.orchestrate.sweep import start_sweep
        from raydiff.sweep.spec import load_sweep

        loaded = load_sweep(args.config, overrides=args.overrides)
        sweep_dir = Path(tempfile.mkdtemp(prefix="raydiff-sweep-bench-")) / "sweep"
        outcome = start_sweep(loaded, output_dir=sweep_dir)
        print(outcome.table)
    result = measure(sweep_dir)

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} s"

    for t in result["trials"]:
        print(
            f"{t['trial']:<40} start-up {seconds(t['startup_s']):>7} (from its process "
            f"{seconds(t['startup_from_process_s']):>7})   steps trained {t['steps_trained']}"
        )
    print(
        f"trial start-up (trial function start -> first step): median "
        f"{seconds(result['startup_s_median'])}, max {seconds(result['startup_s_max'])}; from "
        f"the trial process's start: median {seconds(result['startup_from_process_s_median'])}"
    )
    print(
        f"steps trained {result['steps_trained']} of {result['steps_without_early_stopping']} "
        f"without early stopping: ASHA saved {100 * result['fraction_saved']:.0f}%"
    )
    out = REPO / "bench" / "results" / "sweep_overhead.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
