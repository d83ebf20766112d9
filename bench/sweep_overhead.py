"""Sweep overhead: seconds from a trial's start to its first training step, and the share of
training steps ASHA saved against running every trial to the end.

Either runs a sweep (default: ``configs/sweep_demo.yaml``; ``--set`` overrides its base config,
e.g. ``--set max_steps=100``) into a temporary folder, or, with ``--sweep-dir DIR``, measures a sweep that already
ran (``make sweep`` leaves ``runs/sweep_demo``).

* start-up: ``trials/<trial>/trial.json``'s ``started`` (the wall time the trial function began,
  written by the trial itself before it starts its Ray Train run) to the wall time of step 1 in
  the trial's own TensorBoard scalar ``train/loss_step`` (stamped when the step ends). It covers
  the Ray Train controller and worker group start, the Ray Data pipeline (the first batch
  included), the model build and one training step. Target: under 15 s here.
* context: what else the 2 cores were doing during a trial's start-up. "alone"; "beside N
  training" (other trials training, one core each in the demo sweep); "with N starting" (other
  trials starting in the same window: their Ray processes and imports compete for the cores).
  The summary gives the start-up of the trials that did not start together with another one.
* ``--cpu-breakdown`` (when this script runs the sweep): every process's CPU time, sampled from
  ``/proc`` every 0.2 s (``bench/process_cpu.py``), summed per process kind over each trial's
  start-up window: which Ray actors, and how many CPU-seconds, a start-up costs.
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

from process_cpu import ALL_CPUS, ProcessCpuSampler  # bench/, next to this script

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
        trials.append(
            {
                "trial": run_dir.name,
                "started": info["started"],
                "first_step": first,
                "last_step": max(wall for _, wall in events),
                "startup_s": None if first is None else first - info["started"],
                "steps_trained": max(step for step, _ in events),
            }
        )
    for t in trials:
        t["starting_beside"], t["training_beside"] = startup_context(t, trials)
    startups = [t["startup_s"] for t in trials if t["startup_s"] is not None]
    not_together = [
        t["startup_s"] for t in trials if t["startup_s"] is not None and not t["starting_beside"]
    ]
    trained = sum(t["steps_trained"] for t in trials)
    full = len(trials) * max_steps
    return {
        "sweep_dir": str(sweep_dir),
        "max_steps": max_steps,
        "trials": trials,
        "startup_s_median": statistics.median(startups) if startups else None,
        "startup_s_max": max(startups) if startups else None,
        "startup_s_not_together_median": (
            statistics.median(not_together) if not_together else None
        ),
        "startup_s_not_together_max": max(not_together) if not_together else None,
        "steps_trained": trained,
        "steps_without_early_stopping": full,
        "fraction_saved": 1 - trained / full if full else None,
    }


def startup_context(trial: dict, trials: list[dict]) -> tuple[int, int]:
    """How many other trials were starting, and how many training, while ``trial`` started."""
    if trial["first_step"] is None:
        return 0, 0
    start, end = trial["started"], trial["first_step"]
    starting = training = 0
    for other in trials:
        if other is trial:
            continue
        other_first = other["first_step"] if other["first_step"] is not None else end
        if other["started"] < end and other_first > start:
            starting += 1
        elif other_first <= start < other["last_step"]:
            training += 1
    return starting, training


def context_label(trial: dict) -> str:
    parts = []
    if trial["starting_beside"]:
        parts.append(f"with {trial['starting_beside']} starting")
    if trial["training_beside"]:
        parts.append(f"beside {trial['training_beside']} training")
    return ", ".join(parts) or "alone"


def cpu_breakdown(sampler: ProcessCpuSampler, trials: list[dict], top: int = 9) -> None:
    """Per trial: CPU-seconds per process kind over its start-up window (added to ``trials``)."""
    for t in trials:
        if t["startup_s"] is None:
            continue
        measured = sampler.cpu_seconds(t["started"], t["first_step"])
        if measured is None:
            continue
        span, seconds = measured
        busy = seconds.pop(ALL_CPUS, 0.0)
        t["cpu_window_s"], t["cpu_busy_s"], t["cpu_s_by_process"] = span, busy, seconds
        listed = ", ".join(f"{name} {used:.1f}" for name, used in list(seconds.items())[:top])
        print(
            f"{t['trial']}: {busy:.1f} CPU-s busy in {span:.1f} s ({busy / span:.2f} cores); "
            f"{listed}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep-dir", type=Path, help="measure this finished sweep instead")
    parser.add_argument("--config", default=str(REPO / "configs" / "sweep_demo.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument(
        "--cpu-breakdown",
        action="store_true",
        help="sample every process's CPU time during the sweep (Linux; not with --sweep-dir)",
    )
    args = parser.parse_args()
    if args.cpu_breakdown and args.sweep_dir is not None:
        parser.error("--cpu-breakdown samples a sweep this script runs: leave out --sweep-dir")

    sweep_dir = args.sweep_dir
    sampler = ProcessCpuSampler(interval=0.2) if args.cpu_breakdown else None
    if sweep_dir is None:
        from raydiff.orchestrate.sweep import start_sweep
        from raydiff.sweep.spec import load_sweep

        loaded = load_sweep(args.config, overrides=args.overrides)
        sweep_dir = Path(tempfile.mkdtemp(prefix="raydiff-sweep-bench-")) / "sweep"
        if sampler is not None:
            sampler.start()
        try:
            outcome = start_sweep(loaded, output_dir=sweep_dir)
        finally:
            if sampler is not None:
                sampler.stop()
        print(outcome.table)
    result = measure(sweep_dir)
    if sampler is not None:
        print("CPU-seconds per process kind during each trial's start-up:")
        cpu_breakdown(sampler, result["trials"])

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} s"

    for t in result["trials"]:
        print(
            f"{t['trial']:<40} start-up {seconds(t['startup_s']):>7}   {context_label(t):<28} "
            f"steps trained {t['steps_trained']}"
        )
    print(
        f"trial start-up (trial function start -> first step): median "
        f"{seconds(result['startup_s_median'])}, max {seconds(result['startup_s_max'])}"
    )
    print(
        f"trials that did not start together with another: median "
        f"{seconds(result['startup_s_not_together_median'])}, max "
        f"{seconds(result['startup_s_not_together_max'])}"
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
