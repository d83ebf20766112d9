"""What a preemption check costs: ``ray.train.get_preemption_info()`` per call, per worker count.

raydiff's loop asks for a preemption notice after every step (``scaling.preemption_check_interval``,
``raydiff.orchestrate.ray_runtime.RayRuntime.preemption_notice``). The call is a barrier of all
workers (rank 0 broadcasts what Ray Train's preemption watcher saw), so every step pays it. This
times ``--calls`` consecutive calls in a ``TorchTrainer`` of 1 and of 2 CPU workers on a fresh
local Ray instance (``--warmup`` untimed calls first) and prints the mean and median per call:

    python bench/preemption_check.py            # 1 and 2 workers, 200 calls each
    python bench/preemption_check.py --use-gpu --workers 1   # a GPU worker, as a GPU run has

On a GPU machine the call costs what it costs on a CPU (it is Ray's barrier, not the device's),
but a GPU step is far shorter: bench/gpu_step.py's step times give the share.

The figures in docs/operations.md ("Elastic and preemptible runs") are this script's output.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import ray
import ray.train
from ray.train.torch import TorchTrainer


def time_calls(config: dict) -> dict:
    """The train function: ``warmup`` calls, then ``calls`` timed ones; rank 0 reports them."""
    for _ in range(config["warmup"]):
        ray.train.get_preemption_info()
    seconds = []
    for _ in range(config["calls"]):
        start = time.perf_counter()
        ray.train.get_preemption_info()
        seconds.append(time.perf_counter() - start)
    return {"seconds": seconds}


def measure(
    workers: int, *, calls: int, warmup: int, storage: str, use_gpu: bool = False
) -> list[float]:
    trainer = TorchTrainer(
        time_calls,
        train_loop_config={"calls": calls, "warmup": warmup},
        scaling_config=ray.train.ScalingConfig(
            num_workers=workers,
            use_gpu=use_gpu,
            resources_per_worker={"CPU": 0.5, "GPU": 1} if use_gpu else {"CPU": 0.5},
        ),
        run_config=ray.train.RunConfig(name=f"preemption-check-{workers}", storage_path=storage),
    )
    return trainer.fit().return_value["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--use-gpu", action="store_true", help="one GPU per worker")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a throwaway local instance
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    print(f"{'workers':>7}  {'calls':>5}  {'mean ms':>7}  {'median ms':>9}")
    with tempfile.TemporaryDirectory() as storage:
        for workers in args.workers:
            seconds = measure(
                workers,
                calls=args.calls,
                warmup=args.warmup,
                storage=storage,
                use_gpu=args.use_gpu,
            )
            print(
                f"{workers:>7}  {len(seconds):>5}  {1e3 * statistics.mean(seconds):>7.2f}  "
                f"{1e3 * statistics.median(seconds):>9.2f}"
            )
    ray.shutdown()


if __name__ == "__main__":
    main()
