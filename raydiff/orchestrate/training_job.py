"""The driver: check the run, build the datasets and run one Ray Train run (PyTorch DDP workers).

``run_training_job(config, output_dir=...)`` returns the final metrics, so a Tune trial can call
it once per trial.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydiff.config import ExperimentConfig
from raydiff.data.config import DataConfig
from raydiff.data.manifest import Manifest, load_manifest
from raydiff.errors import RunFailedError, RunInterruptedError, UserInputError, first_line
from raydiff.orchestrate.driver_signals import StopSignal, sigterm_as_ctrl_c
from raydiff.orchestrate.node_network import refuse_unreachable_gloo_nodes
from raydiff.orchestrate.node_paths import refuse_paths_nodes_cannot_see
from raydiff.orchestrate.ray_session import (
    ensure_ray,
    quiet_ray_console,
    report_capacity,
    verbose,
)
from raydiff.storage import (
    StoragePath,
    names_a_bucket,
    ray_storage,
    resolve_location,
    resolved,
)
from raydiff.tracking import start_tracking
from raydiff.train.preflight import StartPoint, plan_start
from raydiff.train.run_lock import run_lock

if TYPE_CHECKING:
    import ray.train
    import ray.train.torch

    from raydiff.train.task import TaskFactory

logger = logging.getLogger(__name__)


def with_absolute_data_dir(config: ExperimentConfig) -> ExperimentConfig:
    """``config`` with its dataset's local path made absolute (workers and trials run in other
    folders): a new config, the caller's is left as it was."""
    data = dataclasses.replace(config.data, data_dir=resolved(config.data.data_dir))
    return dataclasses.replace(config, data=data)


def dataset_config(data: DataConfig, *, split_train: bool = True) -> ray.train.DataConfig:
    """How Ray Train hands a run's datasets to its workers: ``train`` (when ``split_train``)
    streaming-split into equal shards, ``val`` whole to every worker, both with the run's
    execution options (without them Train drops ``preserve_order``)."""
    import ray.train

    from raydiff.data.pipeline import execution_options

    return ray.train.DataConfig(
        datasets_to_split=["train"] if split_train else [],
        execution_options=execution_options(data),
    )


def run_training_job(
    config: ExperimentConfig,
    *,
    output_dir: str | Path,
    resume: str | Path | None = None,
    manifest: Manifest | None = None,
    address: str | None = None,
    callbacks: list[Any] | None = None,
    cached_splits: dict[str, Any] | None = None,
    make_task: TaskFactory | None = None,
    tracking_parent: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train ``config`` with Ray Train; returns rank 0's final metrics plus the checkpoint path.

    Re-running with the same ``output_dir`` continues that run from its latest checkpoint; a run
    already at ``train.max_steps`` returns at once (its step and checkpoint) without starting Ray.
    ``manifest``: the dataset's, when the caller has read it. ``address``: as :func:`ensure_ray`
    takes it. ``callbacks``: Ray Train ``UserCallback``s (a sweep trial relays its reports to Tune
    with one). ``cached_splits``: the splits already in the object store (``raydiff.data.pipeline.
    cache_splits``: a sweep decodes once for all its trials). ``make_task``: the workers' task
    factory (default: the task ``train.task`` names). ``tracking_parent``: a sweep's tracked
    runs, this run's parents.
    """
    # Every check runs before Ray is even imported: a bad config must not start a cluster.
    config = with_absolute_data_dir(config)  # workers chdir into their run folder
    out = resolve_location(output_dir)  # an absolute local path, or a URI (raydiff.storage)
    resume_path = resolve_location(resume) if resume else None
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", out.name):
        # Ray Train stores the run under storage_path/name: a sanitised name would put the
        # checkpoints in another folder than the one every other file (and resume) uses.
        raise UserInputError(
            f"--output {output_dir}: the run folder's name {out.name!r} becomes the Ray Train run "
            f"name and may only hold letters, digits, '_', '.' and '-' (e.g. "
            f"{re.sub(r'[^A-Za-z0-9_.-]', '-', out.name)!r})"
        )
    if names_a_bucket(out):
        raise UserInputError(
            f"--output {out}: give the run a folder inside the bucket, e.g. {out}/runs/NAME"
        )
    manifest = manifest or load_manifest(config.data.data_dir)
    start = plan_start(config, output_dir=out, resume=resume_path, manifest=manifest)
    if start.finished is not None:
        return start.finished
    # One driver per run folder (raydiff.train.run_lock): a second one is refused here, before
    # Ray starts; the lock is held until this run returns or fails.
    with run_lock(out):
        # The run's tracked runs, created once and continued by every later attempt.
        start_tracking(config, run_dir=out, parent=tracking_parent)
        return _train_on_ray(
            config,
            out=out,
            start=start,
            manifest=manifest,
            address=address,
            callbacks=callbacks,
            cached_splits=cached_splits,
            make_task=make_task,
        )


def _train_on_ray(
    config: ExperimentConfig,
    *,
    out: StoragePath,
    start: StartPoint,
    manifest: Manifest,
    address: str | None,
    callbacks: list[Any] | None,
    cached_splits: dict[str, Any] | None,
    make_task: TaskFactory | None,
) -> dict[str, Any]:
    """:func:`run_training_job` once its checks passed and it holds the run folder."""
    # Join or start the run's Ray cluster (with room for the checkpoint evaluator), quiet.
    ensure_ray(
        address=address,
        num_workers=config.scaling.max_workers,
        cpus_per_worker=config.scaling.cpus_per_worker,
        extra_cpus=config.evaluation.cpus if config.evaluation.every_checkpoint else 0.0,
    )
    refuse_paths_nodes_cannot_see(
        {"--output": out, "--data": config.data.data_dir, "the checkpoint": start.checkpoint}
    )
    refuse_unreachable_gloo_nodes(
        use_gpu=config.scaling.use_gpu, num_workers=config.scaling.max_workers
    )
    report_capacity(
        min_workers=config.scaling.min_workers,
        cpus_per_worker=config.scaling.cpus_per_worker,
        use_gpu=config.scaling.use_gpu,
    )
    from ray.data import DataContext

    # Ray Data's per-operator bars drown the training log; the dashboard shows them.
    DataContext.get_current().enable_progress_bars = False
    quiet_ray_console()  # after ray.data's import: its console handler gets the noise filter
    from raydiff.orchestrate.metrics import RunEventMetrics
    from raydiff.orchestrate.repeated_failure import StopRepeatedFailure

    # The run's failure and preemption gauges, then the stop on a repeated failure (it raises,
    # so it comes last: the failure it ends the run on is counted too).
    callbacks = [*(callbacks or []), RunEventMetrics(out.name), StopRepeatedFailure()]
    evaluator = None
    if config.evaluation.every_checkpoint:
        from raydiff.orchestrate.checkpoint_eval import (
            CheckpointEvaluationCallback,
            CheckpointEvaluator,
        )

        # On evaluation.cpus CPUs (a GPU on a GPU run). A run folder under a URI travels with
        # its filesystem (the driver's credentials included).
        resources: dict[str, float] = {"num_cpus": config.evaluation.cpus}
        if config.scaling.use_gpu:
            resources = {"num_cpus": 1, "num_gpus": 1}
        evaluator = CheckpointEvaluator.options(**resources).remote(
            config, out, max(1, int(config.evaluation.cpus))
        )
        callbacks.append(CheckpointEvaluationCallback(evaluator))
    if start.checkpoint is not None:
        logger.info("continuing from %s (step %d)", start.checkpoint, start.progress.get("step", 0))
    actor_needed = config.train.schedule_sampler == "loss-second-moment"
    if actor_needed:
        from raydiff.orchestrate.loss_history_actor import get_or_create_actor

        get_or_create_actor(
            out, num_timesteps=config.diffusion.diffusion_steps, resume_checkpoint=start.checkpoint
        )
    trainer = _torch_trainer(
        config,
        out=out,
        start=start,
        manifest=manifest,
        cached_splits=cached_splits,
        callbacks=callbacks,
        make_task=make_task,
    )
    return _fit(trainer, config, out=out, evaluator=evaluator, actor_needed=actor_needed)


def _fit(
    trainer: ray.train.torch.TorchTrainer,
    config: ExperimentConfig,
    *,
    out: StoragePath,
    evaluator: Any,
    actor_needed: bool,
) -> dict[str, Any]:
    """Run ``trainer``: rank 0's final metrics, the checkpoint evaluations, the last checkpoint
    and the run; a failure or a stop said as where the run stands. The run's actors go at the
    end, however it ends."""
    import ray
    import ray.train

    max_failures = config.scaling.max_failures
    stopped = StopSignal()
    try:
        with sigterm_as_ctrl_c() as stopped:
            result = trainer.fit()
        evaluation = None
        if evaluator is not None:
            from raydiff.orchestrate.checkpoint_eval import wait_for_evaluations

            evaluation = wait_for_evaluations(evaluator, last_step=config.train.max_steps)
    except ray.train.TrainingFailedError as error:  # max_failures used up: say where it stands
        raise run_failed_error(error, run_dir=out, max_failures=max_failures) from error
    except SystemExit as error:
        # Ctrl-C: Ray Train's SIGINT handler aborts the run, and fit() leaves through SystemExit
        # with no message (status 0, or 1 from an interrupted ray.get). Say where it stands.
        raise RunInterruptedError(
            f"stopped by {stopped.described}; Ray Train stopped the run's workers. {where_it_stands(out)}",
            signal_name=stopped.name,
        ) from error
    finally:
        if actor_needed:
            from raydiff.orchestrate.loss_history_actor import kill_actor

            kill_actor(out)
        if evaluator is not None:
            ray.kill(evaluator)
    metrics = dict(result.return_value or {})
    if evaluation is not None:
        metrics["evaluation"] = evaluation
    if result.checkpoint is not None:  # Ray's path is on the run's filesystem: name it in out
        metrics["checkpoint"] = str(out / Path(result.checkpoint.path).name)
    metrics["output_dir"] = str(out)
    return metrics


def _torch_trainer(
    config: ExperimentConfig,
    *,
    out: StoragePath,
    start: StartPoint,
    manifest: Manifest,
    cached_splits: dict[str, Any] | None,
    callbacks: list[Any],
    make_task: TaskFactory | None,
) -> ray.train.torch.TorchTrainer:
    """Ray Train's ``TorchTrainer`` for the run and its datasets: Ray's ``TorchConfig`` sets up the
    process group (gloo on CPU, NCCL with ``scaling.use_gpu``, each worker on its own GPU)."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from raydiff.data.cached_split import CachedSplit
    from raydiff.data.pipeline import build_datasets
    from raydiff.orchestrate.worker import train_loop_per_worker

    # A resumed run's data pipeline starts at the checkpoint's epoch (its block order included);
    # the workers then skip the part of that epoch already trained on.
    datasets = build_datasets(
        config.data,
        manifest=manifest,
        epoch_offset=start.progress.get("epoch", 0),
        cached=cached_splits,
    )
    num_val_images = 0
    if "val" in datasets:
        # Every rank reads these rows (all of the split when it holds fewer) and evaluates its
        # slice of them (RayRuntime.val_batches): the same images at every evaluation and for
        # any worker count, and no streaming-split coordinator for a split this small.
        datasets["val"] = datasets["val"].limit(config.train.eval_num_images)
        val_rows = manifest.splits[config.data.val_split].num_rows
        num_val_images = min(config.train.eval_num_images, val_rows)
    scaling = config.scaling
    storage_path, filesystem = ray_storage(out.parent)
    train = datasets.get("train")
    cached_train = train if isinstance(train, CachedSplit) else None
    ray_datasets = {name: d for name, d in datasets.items() if not isinstance(d, CachedSplit)}
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "config": config,  # the typed config itself: it crosses to the workers once
            "output_dir": out,  # a Path, or a RemotePath with its filesystem
            # What the workers start from while the run folder has no complete checkpoint of
            # its own (then they take its newest, RayRuntime.resume_checkpoint): --resume, or
            # the newest complete checkpoint in the folder (also one a --single-process run
            # wrote).
            "resume": start.checkpoint,
            "datasets": sorted(ray_datasets),  # the names of those passed to Train
            "num_val_images": num_val_images,  # 0 without a val split
            "make_task": make_task,  # None: the task train.task names
            "cached_train": cached_train,  # None: streamed; else its blocks, each node maps them once
            "verbose": verbose(),  # raydiff -v: Ray's console output as Ray makes it
        },
        torch_config=TorchConfig(),
        scaling_config=ray.train.ScalingConfig(
            num_workers=scaling.num_workers,
            use_gpu=scaling.use_gpu,
            resources_per_worker={"CPU": scaling.cpus_per_worker},
            elastic_resize_monitor_interval_s=scaling.resize_check_interval_s,
        ),
        run_config=ray.train.RunConfig(
            name=out.name,
            # Ray Train keeps the run (its checkpoints) in out. A URI's filesystem is the
            # driver's (S3 configured from its environment: raydiff.storage), used as is.
            storage_path=storage_path,
            storage_filesystem=filesystem,
            failure_config=ray.train.FailureConfig(
                max_failures=scaling.max_failures,
                max_preemption_failures=scaling.max_preemption_failures,
            ),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=scaling.checkpoints_to_keep),
            logging_config=ray.train.LoggingConfig(log_level="INFO" if verbose() else "WARNING"),
            callbacks=callbacks,
        ),
        datasets=ray_datasets,
        dataset_config=dataset_config(config.data, split_train="train" in ray_datasets),
    )


def run_failed_error(
    error: Exception, *, run_dir: StoragePath, max_failures: int
) -> RunFailedError:
    """What a user is told when Ray Train gives up on a run (``fit()`` raised
    ``ray.train.TrainingFailedError``): what failed, after how many restarts, the last complete
    checkpoint the run left, and how to continue from it. A failure that recurred after a
    restart (``raydiff.orchestrate.repeated_failure``) is said as such, restarts left or not."""
    from raydiff.train.failure import RepeatedFailureError

    # ray.train.ControllerError's failure: the controller ran StopRepeatedFailure's check.
    repeated = getattr(error, "controller_failure", None)
    if isinstance(repeated, RepeatedFailureError):
        return RunFailedError(
            f"training stopped (scaling.max_failures={max_failures}): {repeated}. "
            f"{where_it_stands(run_dir)} once the cause is fixed (Ray's logs of the failure: "
            "raydiff -v, or the cluster's logs/ folder)"
        )
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


def where_it_stands(run_dir: StoragePath) -> str:
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
