"""``train_loop_per_worker``: the one training loop (``raydiff.train.loop``) on a Ray Train worker.

This module imports no torch, on purpose: the driver (a sweep's trial too) pickles the function
by reference, so importing this module is all it costs there. Ray Train's ``TorchConfig`` has
set up the run's process group (gloo, or NCCL on the worker's GPU) before the function starts;
the function first asks for the training split's shard (in the background), then builds the
model. The loop's runtime on a worker is :class:`raydiff.orchestrate.ray_runtime.RayRuntime`.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import ray.train

from raydiff.storage import as_location

if TYPE_CHECKING:
    from raydiff.config import ExperimentConfig


def train_loop_per_worker(loop_config: dict[str, Any]) -> dict[str, Any]:
    """The function every Ray Train worker runs; ``loop_config``'s keys are said where the
    driver builds it (``raydiff.orchestrate.training_job._torch_trainer``)."""
    config: ExperimentConfig = loop_config["config"]
    if "train" in loop_config["datasets"]:
        # The first request of a streaming-split dataset makes Ray Data start the split's
        # coordinator, a new actor process (1.5-3 s here before its first batch): asked for now,
        # in a background thread, it comes up while this worker imports the training modules
        # and builds the model. Ray Train keeps the shard: the loop's own get_dataset_shard
        # gets the same iterator (waiting for this request if still under way), and a failure
        # shows there, in the loop.
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raydiff-shard-train")
        pool.submit(ray.train.get_dataset_shard, "train")
        pool.shutdown(wait=False)
    from raydiff.orchestrate.ray_runtime import RayRuntime  # the model's modules: seconds
    from raydiff.train.loop import run_loop
    from raydiff.train.tasks import task_of_config

    context = ray.train.get_context()
    runtime = RayRuntime(
        config,
        rank=context.get_world_rank(),
        world_size=context.get_world_size(),
        output_dir=as_location(loop_config["output_dir"]),
        resume=as_location(loop_config["resume"]) if loop_config["resume"] else None,
        num_val_images=loop_config["num_val_images"],
        cached_train=loop_config["cached_train"],
    )
    # raydiff's loggers rank-prefixed, INFO on rank 0 and WARNING elsewhere. Ray's console
    # output is set for the whole job by raydiff.orchestrate.ray_session (Ray Train's own
    # ray.train logs follow the run's LoggingConfig), not here.
    handler = logging.StreamHandler()
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s [rank {runtime.rank}] %(name)s: %(message)s")
    )
    package = logging.getLogger("raydiff")
    package.handlers[:] = [handler]
    package.setLevel(logging.INFO if runtime.is_main else logging.WARNING)
    package.propagate = False
    if not loop_config["verbose"]:
        # Ray's INFO lines of this process, through its public loggers: Ray Train logs every
        # report of every rank under a logger named after its source file, which reaches the
        # root logger; the validation split is executed here, by every rank ("Starting
        # execution of Dataset"; Ray Data set its logger's level on import, done by now).
        for name in ("", "ray.data"):
            logging.getLogger(name).setLevel(logging.WARNING)
    make_task = loop_config["make_task"] or task_of_config
    return run_loop(config, runtime=runtime, output_dir=runtime.output_dir, make_task=make_task)
