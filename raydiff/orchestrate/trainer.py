"""The driver: check the run, build the datasets and run one Ray Train run (PyTorch DDP workers).

``run_training_job(config, output_dir=...)`` returns the final metrics, so a Tune trial can call
it once per trial.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydiff.config import ExperimentConfig
from raydiff.data.config import DataConfig
from raydiff.data.manifest import Manifest, load_manifest
from raydiff.errors import RunFailedError, RunInterruptedError, UserInputError, first_line
from raydiff.storage import RemotePath, resolve_location
from raydiff.train.preflight import StartPoint, plan_start
from raydiff.train.run_lock import run_lock

if TYPE_CHECKING:
    import ray.train

logger = logging.getLogger(__name__)


def absolute_uri(uri: str) -> str:
    """A local path made absolute (workers and trials run in other folders); URIs as given."""
    return uri if "://" in uri else str(Path(uri).expanduser().resolve())


RUN_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def check_remote_output(out: RemotePath) -> None:
    """What a run folder given as a URI (``raydiff.storage``) cannot be."""
    if "/" not in out.path:
        raise UserInputError(
            f"--output {out}: give the run a folder inside the bucket, e.g. {out}/runs/NAME"
        )


def storage_options(run_dir: Path | RemotePath) -> dict[str, Any]:
    """``RunConfig``'s storage arguments: Ray Train keeps the run (its checkpoints) in
    ``run_dir``. A URI's filesystem is the driver's (S3 configured from its environment,
    credentials included: ``raydiff.storage``); Train's controller and workers use it as is."""
    if isinstance(run_dir, RemotePath):
        return {"storage_path": run_dir.parent.path, "storage_filesystem": run_dir.filesystem}
    return {"storage_path": str(run_dir.parent)}


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
        ray.init(address=address, **ray_init_options(local=False))
        logger.info("connected to the Ray cluster at %s", address)
        return
    # Training workers must not take every CPU or Ray Data has none left to decode with, hence
    # the spare logical CPUs.
    needed = math.ceil(num_workers * cpus_per_worker + extra_cpus) + 2
    context = start_local_ray(
        num_cpus=max(os.cpu_count() or 1, needed), **ray_init_options(local=True)
    )
    logger.info(
        "started a local Ray instance (dashboard: http://%s; Ray's logs: %s/logs)",
        context.dashboard_url or "-",
        context.address_info["session_dir"],
    )


def start_run_state_actor() -> None:
    """Start Ray Train's run-state actor (what the dashboard's Train page shows) if it is not up.

    Ray Train starts it in the controller of the cluster's first run, and that controller waits
    for the new process (2-3 s on 2 cores) before it starts its workers. Started by the driver
    before it prepares its datasets, it comes up meanwhile. A no-op with state tracking off.
    """
    if os.environ.get("RAY_TRAIN_ENABLE_STATE_TRACKING") != "1":
        return
    try:
        from ray.train.v2._internal.state.state_actor import get_or_create_state_actor
    except ImportError:  # another Ray version: its controller starts the actor itself
        return
    get_or_create_state_actor()  # returns at once; a second call finds the same actor


# Environment for a Ray instance this process starts itself (the raylet and every worker inherit
# it). Train V2 runs a PreemptionWatcher actor per run that polls for cloud spot-instance
# preemption notices. A local instance lives and dies with this machine, so the watcher can never
# fire; like every idle Ray Python process it still wakes up 100 times a second (Ray's
# signal-check timer), taking ~0.6% of a core from training (measured on the 2-core CI VM).
# Clusters started with `ray start` keep Ray's defaults. Ray Train sets
# RAY_WARN_BLOCKING_GET_INSIDE_ASYNC=0 in its controller's runtime_env, which a local instance's
# controllers do without (raydiff.orchestrate.local_instance): here every process has it.
LOCAL_INSTANCE_ENV = {
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_WARN_BLOCKING_GET_INSIDE_ASYNC": "0",
}


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
    """Start a new local Ray instance with raydiff's local-instance environment and its workers'
    setup hook (``raydiff.orchestrate.console``).

    Values of ``LOCAL_INSTANCE_ENV`` already set in the environment win. ``init_kwargs`` go to
    ``ray.init``; returns its ``RayContext``.
    """
    import ray

    from raydiff.orchestrate.console import local_instance_environment
    from raydiff.orchestrate.local_instance import LOCAL_INSTANCE_VAR

    for name, value in LOCAL_INSTANCE_ENV.items():
        os.environ.setdefault(name, value)
    os.environ.update(local_instance_environment())
    os.environ[LOCAL_INSTANCE_VAR] = "1"
    return ray.init(address="local", num_cpus=num_cpus, **init_kwargs)


def sampler_actor_key(run_dir: Path | RemotePath) -> str:
    """The key of the loss-history actor of the run in ``run_dir`` (an absolute path or a URI).

    Per run folder, not per folder name: two runs called "demo" in different places must not
    share (or kill) one loss history.
    """
    return f"{run_dir.name}-{hashlib.sha1(str(run_dir).encode()).hexdigest()[:10]}"


def dataset_config(data: DataConfig) -> ray.train.DataConfig:
    """How Ray Train hands a run's datasets to its workers: ``train`` streaming-split into equal
    shards, ``val`` (the first ``eval_num_images`` rows) whole to every worker, both with the
    run's execution options (without them Train drops ``preserve_order``)."""
    import ray.train

    from raydiff.data.pipeline import execution_options

    return ray.train.DataConfig(
        datasets_to_split=["train"], execution_options=execution_options(data)
    )


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
    out = resolve_location(output_dir)  # an absolute local path, or a URI (raydiff.storage)
    resume_path = resolve_location(resume) if resume else None
    if not RUN_NAME.fullmatch(out.name):
        # Ray Train stores the run under storage_path/name: a sanitised name would put the
        # checkpoints in another folder than the one every other file (and resume) uses.
        raise UserInputError(
            f"--output {output_dir}: the run folder's name {out.name!r} becomes the Ray Train run "
            f"name and may only hold letters, digits, '_', '.' and '-' (e.g. "
            f"{re.sub(r'[^A-Za-z0-9_.-]', '-', out.name)!r})"
        )
    if isinstance(out, RemotePath):
        check_remote_output(out)
    manifest = manifest or load_manifest(config.data.data_dir)
    start = plan_start(config, output_dir=out, resume=resume_path, manifest=manifest)
    if start.finished is not None:
        return start.finished
    # One driver per run folder (raydiff.train.run_lock): a second one is refused here, before
    # Ray starts; the lock is held until this run returns or fails.
    # Object stores have no locks: one driver per remote run folder is the user's to ensure.
    with run_lock(out) if isinstance(out, Path) else contextlib.nullcontext():
        return _train_on_ray(
            config,
            out=out,
            start=start,
            manifest=manifest,
            address=address,
            show_data_progress=show_data_progress,
            callbacks=callbacks,
            cached_splits=cached_splits,
        )


def _train_on_ray(
    config: ExperimentConfig,
    *,
    out: Path | RemotePath,
    start: StartPoint,
    manifest: Manifest,
    address: str | None,
    show_data_progress: bool,
    callbacks: list[Any] | None,
    cached_splits: dict[str, Any] | None,
) -> dict[str, Any]:
    """:func:`run_training_job` once its checks passed and it holds the run folder."""
    resumed_from, progress = start.checkpoint, start.progress

    # No torch in this process (a sweep trial's, or the driver's): Ray Train's TorchTrainer is
    # its DataParallelTrainer with ray.train.torch's TorchConfig, whose module imports torch.
    import ray
    import ray.train

    from raydiff.data.pipeline import build_datasets
    from raydiff.orchestrate.console import train_log_level
    from raydiff.orchestrate.local_instance import EnvInheritingTrainer
    from raydiff.orchestrate.torch_backend import TorchRendezvous
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
    start_run_state_actor()
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
    if "val" in datasets:
        # Every rank reads these rows and evaluates its slice of them (RayRuntime.val_batches):
        # the same images at every evaluation and for any worker count, and no streaming-split
        # coordinator process for a split this small.
        datasets["val"] = datasets["val"].limit(config.train.eval_num_images)
    actor_needed = config.train.schedule_sampler == "loss-second-moment"
    if actor_needed:
        from raydiff.orchestrate.sampler_actor import get_or_create_actor

        get_or_create_actor(
            actor_key,
            num_timesteps=config.diffusion.diffusion_steps,
            run_dir=out,
            resume_checkpoint=resumed_from,
        )
    trainer = EnvInheritingTrainer(
        train_loop_per_worker,
        train_loop_config={
            "config": config,  # the typed config itself: it crosses to the workers once
            "actor_key": actor_key,
            "output_dir": out,  # a Path, or a RemotePath with its filesystem
            # What the workers start from while the run folder has no complete checkpoint of
            # its own (then they take its newest, RayRuntime.resume_checkpoint): --resume, or
            # the newest complete checkpoint in the folder (also one a --single-process run
            # wrote).
            "resume": resumed_from,
            "datasets": sorted(datasets),
        },
        # Ray's TorchConfig, minus torch in the controller (raydiff.orchestrate.torch_backend).
        backend_config=TorchRendezvous(),
        scaling_config=ray.train.ScalingConfig(
            num_workers=scaling.num_workers,
            use_gpu=scaling.use_gpu,
            resources_per_worker={"CPU": scaling.cpus_per_worker},
        ),
        run_config=ray.train.RunConfig(
            name=run_name,
            **storage_options(out),
            failure_config=ray.train.FailureConfig(max_failures=scaling.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=scaling.checkpoints_to_keep),
            logging_config=ray.train.LoggingConfig(log_level=train_log_level()),
            callbacks=callbacks,
        ),
        datasets=datasets,
        dataset_config=dataset_config(config.data),
    )
    try:
        result = trainer.fit()
        evaluation = None
        if evaluator is not None:
            from raydiff.orchestrate.checkpoint_eval import wait_for_evaluations

            evaluation = wait_for_evaluations(evaluator, last_step=config.train.max_steps)
    except ray.train.TrainingFailedError as error:  # max_failures used up: say where it stands
        raise run_failed_error(error, run_dir=out, max_failures=scaling.max_failures) from error
    except SystemExit as error:
        # Ctrl-C: Ray Train's SIGINT handler aborts the run, and fit() leaves through SystemExit
        # with no message (status 0, or 1 from an interrupted ray.get). Say where it stands.
        raise RunInterruptedError(
            f"stopped by Ctrl-C (SIGINT); Ray Train stopped the run's workers. "
            f"{where_it_stands(out)}"
        ) from error
    finally:
        if actor_needed:
            from raydiff.orchestrate.sampler_actor import kill_actor

            kill_actor(actor_key)
        if evaluator is not None:
            ray.kill(evaluator)
    metrics = dict(result.return_value or {})
    if evaluation is not None:
        metrics["evaluation"] = evaluation
    if result.checkpoint is not None:
        checkpoint = result.checkpoint.path
        if isinstance(out, RemotePath):  # a path on the run's filesystem: give the URI
            checkpoint = str(out / Path(checkpoint).name)
        metrics["checkpoint"] = checkpoint
    metrics["output_dir"] = str(out)
    return metrics


def run_failed_error(
    error: Exception, *, run_dir: Path | RemotePath, max_failures: int
) -> RunFailedError:
    """What a user is told when Ray Train gives up on a run (``fit()`` raised
    ``ray.train.TrainingFailedError``): what failed, after how many restarts, the last complete
    checkpoint the run left, and how to continue from it."""
    import ray.train

    if isinstance(error, ray.train.WorkerGroupError):
        failures = "; ".join(
            f"rank {rank}: {first_line(failure)}"
            for rank, failure in sorted(error.worker_failures.items())
        )
        restarts = {0: "without a restart", 1: "after 1 restart"}.get(
            max_failures, f"after {max_failures} restarts"
        )
        what = f"training failed {restarts} (scaling.max_failures={max_failures}): {failures}"
    else:  # ray.train.ControllerError: Ray Train's own controller failed
        what = f"Ray Train's controller failed: {first_line(error)}"
    return RunFailedError(
        f"{what}. {where_it_stands(run_dir)} (raise scaling.max_failures, -1 for no limit, to "
        "ride out more failures; Ray's logs of the failure: raydiff -v, or the cluster's logs/ "
        "folder)"
    )


def where_it_stands(run_dir: Path | RemotePath) -> str:
    """The run's last complete checkpoint and how to continue from it, as one sentence."""
    from raydiff.train.checkpoint import latest_checkpoint, read_progress

    last = latest_checkpoint(run_dir)
    if last is None:
        return "It left no complete checkpoint: running the same command again starts over"
    step = read_progress(last).get("step")
    return (
        f"The last complete checkpoint is {last} (step {step}): run the same command again to "
        "continue from it"
    )
