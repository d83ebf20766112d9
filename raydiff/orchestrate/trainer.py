"""The driver: validate the config, build the datasets and run one ``TorchTrainer``.

``run_training_job(config_dict)`` is a function of a config dict that returns the final metrics,
so a Tune trial (the sweep issue) can call it once per trial.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
from pathlib import Path
from typing import Any

from raydiff.config import ExperimentConfig, from_dict, to_dict
from raydiff.train.preflight import plan_start

logger = logging.getLogger(__name__)


def sync_data_config(config: ExperimentConfig) -> ExperimentConfig:
    """Make the data path absolute: workers chdir into their own run folder."""
    config.data.data_dir = _absolute(config.data.data_dir)
    return config


def _absolute(uri: str) -> str:
    return uri if "://" in uri else str(Path(uri).expanduser().resolve())


RUN_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def ensure_ray(*, num_workers: int, cpus_per_worker: float) -> None:
    """Connect to a running cluster (RAY_ADDRESS or a local `ray start`), else start one here."""
    import ray

    if ray.is_initialized():
        return
    # The dashboard's Train page needs state tracking switched on in the driver.
    os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_TRACKING", "1")
    address = os.environ.get("RAY_ADDRESS", "")
    if address and address != "local":
        ray.init(address=address)
        return
    if not address:
        # A cluster started with `ray start` on this machine records its address in Ray's temp
        # folder. Not ray.init(address="auto"): that also joins any other process's private
        # ray.init() instance, and the run dies with that process.
        from ray._private.services import find_bootstrap_address

        cluster = find_bootstrap_address(None)
        if cluster:
            try:
                ray.init(address=cluster)
                logger.info("connected to the Ray cluster at %s (ray start)", cluster)
                return
            except ConnectionError:  # a stale record of a stopped cluster
                logger.info("no Ray cluster answers at %s; starting a local one", cluster)
    # A new local instance (RAY_ADDRESS=local forces one). Training workers must not take every
    # CPU or Ray Data has none left to decode with, hence the spare logical CPUs.
    needed = math.ceil(num_workers * cpus_per_worker) + 2
    start_local_ray(num_cpus=max(os.cpu_count() or 1, needed))
    logger.info("started a local Ray instance (dashboard: http://127.0.0.1:8265)")


# Environment for a Ray instance this process starts itself (the raylet and every worker inherit
# it). Train V2 runs a PreemptionWatcher actor per run that polls for cloud spot-instance
# preemption notices. A local instance lives and dies with this machine, so the watcher can never
# fire; like every idle Ray Python process it still wakes up 100 times a second (Ray's
# signal-check timer), taking ~0.6% of a core from training (measured on the 2-core CI VM).
# Clusters started with `ray start` keep Ray's defaults.
LOCAL_INSTANCE_ENV = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}


def start_local_ray(*, num_cpus: int, **init_kwargs: Any) -> None:
    """Start a new local Ray instance with raydiff's local-instance environment.

    Values already set in the environment win. ``init_kwargs`` go to ``ray.init``.
    """
    import ray

    for name, value in LOCAL_INSTANCE_ENV.items():
        os.environ.setdefault(name, value)
    ray.init(address="local", num_cpus=num_cpus, **init_kwargs)


def run_training_job(
    config_dict: dict[str, Any],
    *,
    output_dir: str,
    resume: str | None = None,
    show_data_progress: bool = False,
) -> dict[str, Any]:
    """Train with Ray Train; returns rank 0's final metrics plus the checkpoint path.

    Re-running with the same ``output_dir`` continues that run from its latest checkpoint; a run
    already at ``train.max_steps`` returns at once (its step and checkpoint) without starting Ray.
    """
    # Validate before Ray is even imported: a bad config must not start a cluster or a worker.
    config = sync_data_config(from_dict(ExperimentConfig, config_dict))
    out = Path(output_dir).expanduser().resolve()
    resume_path = Path(resume).expanduser().resolve() if resume else None
    if not RUN_NAME.fullmatch(out.name):
        # Ray Train stores the run under storage_path/name: a sanitised name would put the
        # checkpoints in another folder than the one every other file (and resume) uses.
        raise ValueError(
            f"--output {output_dir}: the run folder's name {out.name!r} becomes the Ray Train run "
            f"name and may only hold letters, digits, '_', '.' and '-' (e.g. "
            f"{re.sub(r'[^A-Za-z0-9_.-]', '-', out.name)!r})"
        )
    start = plan_start(config, output_dir=out, resume=resume_path)
    if start.finished is not None:
        return start.finished
    resumed_from, progress = start.checkpoint, start.progress

    import ray.train
    from ray.train.torch import TorchTrainer

    from raydiff.data.pipeline import build_datasets, execution_options
    from raydiff.orchestrate.sampler_actor import get_or_create_actor, kill_actor
    from raydiff.orchestrate.worker import train_loop_per_worker

    scaling = config.scaling
    ensure_ray(num_workers=scaling.num_workers, cpus_per_worker=scaling.cpus_per_worker)

    run_name = out.name
    # The sampler actor is named per run folder, not per folder name: two runs called "demo" in
    # different places must not share (or kill) one loss history.
    actor_key = f"{run_name}-{hashlib.sha1(str(out).encode()).hexdigest()[:10]}"
    if resumed_from is not None:
        logger.info("continuing from %s (step %d)", resumed_from, progress.get("step", 0))
    if not show_data_progress:
        from ray.data import DataContext

        # Ray Data's per-operator bars drown the training log; the dashboard shows them.
        DataContext.get_current().enable_progress_bars = False
    # A resumed run's data pipeline starts at the checkpoint's epoch (its block order included);
    # the workers then skip the part of that epoch already trained on.
    datasets = build_datasets(config.data, epoch_offset=progress.get("epoch", 0))
    actor_needed = config.train.schedule_sampler == "loss-second-moment"
    if actor_needed:
        get_or_create_actor(actor_key, num_timesteps=config.diffusion.diffusion_steps)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "config": to_dict(config),
            "actor_key": actor_key,
            "output_dir": str(out),
            # What the workers start from when Ray Train has no checkpoint of its own for this
            # run (after a failure it has, and that one is newer): --resume, or the newest
            # complete checkpoint in the folder (also one a --single-process run wrote).
            "resume": str(resumed_from) if resumed_from else None,
            "datasets": sorted(datasets),
        },
        scaling_config=ray.train.ScalingConfig(
            num_workers=scaling.num_workers,
            use_gpu=scaling.use_gpu,
            resources_per_worker={"CPU": scaling.cpus_per_worker},
        ),
        run_config=ray.train.RunConfig(
            name=run_name,
            storage_path=str(out.parent),
            failure_config=ray.train.FailureConfig(max_failures=scaling.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=scaling.checkpoints_to_keep),
        ),
        datasets=datasets,
        dataset_config=ray.train.DataConfig(
            datasets_to_split=["train", *(["val"] if "val" in datasets else [])],
            execution_options=execution_options(config.data),
        ),
    )
    try:
        result = trainer.fit()
    finally:
        if actor_needed:
            kill_actor(actor_key)
    metrics = dict(result.return_value or {})
    if result.checkpoint is not None:
        metrics["checkpoint"] = result.checkpoint.path
    metrics["output_dir"] = str(out)
    return metrics
