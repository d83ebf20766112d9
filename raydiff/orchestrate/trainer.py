"""The driver: check the run, build the datasets and run one ``TorchTrainer``.

``run_training_job(config, output_dir=...)`` returns the final metrics, so a Tune trial can call
it once per trial.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
from pathlib import Path
from typing import Any

from raydiff.config import ExperimentConfig
from raydiff.data.manifest import Manifest, load_manifest
from raydiff.errors import UserInputError
from raydiff.train.preflight import plan_start

logger = logging.getLogger(__name__)


def absolute_uri(uri: str) -> str:
    """A local path made absolute (workers and trials run in other folders); URIs as given."""
    return uri if "://" in uri else str(Path(uri).expanduser().resolve())


RUN_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def ensure_ray(
    *, address: str | None, num_workers: int, cpus_per_worker: float, extra_cpus: float = 0.0
) -> None:
    """Join the Ray cluster at ``address``, else start a local instance for this run.

    ``address``: ``auto`` (the cluster a ``ray start`` on this machine runs), ``HOST:PORT`` or
    ``ray://...``; ``None`` takes ``RAY_ADDRESS`` (what ``ray job submit`` sets for its driver)
    and without it starts a new local instance. Never ``ray.init()``'s own guess: on a machine
    where another process runs a private instance it would join that, and the run would die
    with that process.
    """
    import ray

    from raydiff.orchestrate.console import ray_init_options

    if ray.is_initialized():
        return
    # The dashboard's Train page needs state tracking switched on in the driver.
    os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_TRACKING", "1")
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    if address != "local":
        ray.init(address=address, **ray_init_options())
        logger.info("connected to the Ray cluster at %s", address)
        return
    # Training workers must not take every CPU or Ray Data has none left to decode with, hence
    # the spare logical CPUs.
    needed = math.ceil(num_workers * cpus_per_worker + extra_cpus) + 2
    context = start_local_ray(num_cpus=max(os.cpu_count() or 1, needed), **ray_init_options())
    logger.info(
        "started a local Ray instance (dashboard: http://%s; Ray's logs: %s/logs)",
        context.dashboard_url or "-",
        context.address_info["session_dir"],
    )


# Environment for a Ray instance this process starts itself (the raylet and every worker inherit
# it). Train V2 runs a PreemptionWatcher actor per run that polls for cloud spot-instance
# preemption notices. A local instance lives and dies with this machine, so the watcher can never
# fire; like every idle Ray Python process it still wakes up 100 times a second (Ray's
# signal-check timer), taking ~0.6% of a core from training (measured on the 2-core CI VM).
# Clusters started with `ray start` keep Ray's defaults.
LOCAL_INSTANCE_ENV = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}


def quiet_ray_console() -> None:
    """Keep Ray's own INFO lines and deprecation notices off this process's console.

    The driver's half of :mod:`raydiff.orchestrate.console` (``ensure_ray`` gives the workers
    theirs): also where Ray was started by someone else (a Tune trial). The lines stay in Ray's
    log files (``/tmp/ray/session_latest/logs``) and come back with ``raydiff -v``.
    """
    from raydiff.orchestrate.console import quiet_ray_process, verbose

    if verbose():
        return
    for name in ("ray", "ray.tune"):
        logging.getLogger(name).setLevel(logging.WARNING)
    quiet_ray_process()


def start_local_ray(*, num_cpus: int, **init_kwargs: Any) -> Any:
    """Start a new local Ray instance with raydiff's local-instance environment.

    Values already set in the environment win. ``init_kwargs`` go to ``ray.init``; returns its
    ``RayContext``.
    """
    import ray

    for name, value in LOCAL_INSTANCE_ENV.items():
        os.environ.setdefault(name, value)
    return ray.init(address="local", num_cpus=num_cpus, **init_kwargs)


def sampler_actor_key(run_dir: Path) -> str:
    """The key of the loss-history actor of the run in ``run_dir`` (an absolute path).

    Per run folder, not per folder name: two runs called "demo" in different places must not
    share (or kill) one loss history.
    """
    return f"{run_dir.name}-{hashlib.sha1(str(run_dir).encode()).hexdigest()[:10]}"


def run_training_job(
    config: ExperimentConfig,
    *,
    output_dir: str | Path,
    resume: str | Path | None = None,
    manifest: Manifest | None = None,
    address: str | None = None,
    show_data_progress: bool = False,
    callbacks: list[Any] | None = None,
    cached_splits: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train ``config`` with Ray Train; returns rank 0's final metrics plus the checkpoint path.

    Re-running with the same ``output_dir`` continues that run from its latest checkpoint; a run
    already at ``train.max_steps`` returns at once (its step and checkpoint) without starting Ray.
    ``manifest``: the dataset's manifest when the caller has read it already. ``address``: the
    Ray cluster to join (:func:`ensure_ray`). ``callbacks``: Ray Train ``UserCallback``s
    (a sweep trial relays its reports to Tune with one). ``cached_splits``: the dataset's splits
    already decoded into the object store (``raydiff.data.pipeline.cache_splits``; a sweep
    decodes once for all its trials).
    """
    # Every check runs before Ray is even imported: a bad config must not start a cluster.
    config.data.data_dir = absolute_uri(config.data.data_dir)  # workers chdir into their run folder
    out = Path(output_dir).expanduser().resolve()
    resume_path = Path(resume).expanduser().resolve() if resume else None
    if not RUN_NAME.fullmatch(out.name):
        # Ray Train stores the run under storage_path/name: a sanitised name would put the
        # checkpoints in another folder than the one every other file (and resume) uses.
        raise UserInputError(
            f"--output {output_dir}: the run folder's name {out.name!r} becomes the Ray Train run "
            f"name and may only hold letters, digits, '_', '.' and '-' (e.g. "
            f"{re.sub(r'[^A-Za-z0-9_.-]', '-', out.name)!r})"
        )
    manifest = manifest or load_manifest(config.data.data_dir)
    start = plan_start(config, output_dir=out, resume=resume_path, manifest=manifest)
    if start.finished is not None:
        return start.finished
    resumed_from, progress = start.checkpoint, start.progress

    import ray
    import ray.train
    from ray.train.torch import TorchTrainer

    from raydiff.data.pipeline import build_datasets, execution_options
    from raydiff.orchestrate.console import train_log_level
    from raydiff.orchestrate.sampler_actor import get_or_create_actor, kill_actor
    from raydiff.orchestrate.worker import train_loop_per_worker

    scaling = config.scaling
    evaluate = config.evaluation.every_checkpoint
    ensure_ray(
        address=address,
        num_workers=scaling.num_workers,
        cpus_per_worker=scaling.cpus_per_worker,
        extra_cpus=config.evaluation.cpus if evaluate else 0.0,
    )
    quiet_ray_console()
    callbacks = list(callbacks or [])
    evaluator = None
    if evaluate:
        from raydiff.orchestrate.checkpoint_eval import (
            CheckpointEvaluationCallback,
            start_evaluator,
        )

        evaluator = start_evaluator(config, run_dir=out)
        callbacks.append(CheckpointEvaluationCallback(evaluator))

    run_name = out.name
    actor_key = sampler_actor_key(out)
    if resumed_from is not None:
        logger.info("continuing from %s (step %d)", resumed_from, progress.get("step", 0))
    if not show_data_progress:
        from ray.data import DataContext

        # Ray Data's per-operator bars drown the training log; the dashboard shows them.
        DataContext.get_current().enable_progress_bars = False
    # A resumed run's data pipeline starts at the checkpoint's epoch (its block order included);
    # the workers then skip the part of that epoch already trained on.
    datasets = build_datasets(
        config.data,
        manifest=manifest,
        epoch_offset=progress.get("epoch", 0),
        cached=cached_splits,
    )
    actor_needed = config.train.schedule_sampler == "loss-second-moment"
    if actor_needed:
        get_or_create_actor(
            actor_key,
            num_timesteps=config.diffusion.diffusion_steps,
            run_dir=out,
            resume_checkpoint=resumed_from,
        )
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "config": config,  # the typed config itself: it crosses to the workers once
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
            logging_config=ray.train.LoggingConfig(log_level=train_log_level()),
            callbacks=callbacks,
        ),
        datasets=datasets,
        dataset_config=ray.train.DataConfig(
            datasets_to_split=["train", *(["val"] if "val" in datasets else [])],
            execution_options=execution_options(config.data),
        ),
    )
    try:
        result = trainer.fit()
        evaluation = None
        if evaluator is not None:
            from raydiff.orchestrate.checkpoint_eval import wait_for_evaluations

            evaluation = wait_for_evaluations(evaluator, last_step=config.train.max_steps)
    finally:
        if actor_needed:
            kill_actor(actor_key)
        if evaluator is not None:
            ray.kill(evaluator)
    metrics = dict(result.return_value or {})
    if evaluation is not None:
        metrics["evaluation"] = evaluation
    if result.checkpoint is not None:
        metrics["checkpoint"] = result.checkpoint.path
    metrics["output_dir"] = str(out)
    return metrics
