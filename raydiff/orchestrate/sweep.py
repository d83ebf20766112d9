"""The Tune driver: one Ray Train run (``run_training_job``) per trial, early stopping by ASHA.

``start_sweep`` runs a checked sweep (:func:`raydiff.sweep.spec.load_sweep`) under
``tune.Tuner``, the workers' reports reaching Tune through :class:`EvaluationRelay`;
``resume_sweep`` continues an interrupted one with ``Tuner.restore`` (which trials run again,
and the sweep folder's layout: docs/sweeps.md).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.tune.integration.ray_train import TuneReportCallback

from raydiff.config import to_yaml
from raydiff.data.manifest import Manifest, load_manifest
from raydiff.data.pipeline import cache_splits
from raydiff.errors import UserInputError
from raydiff.orchestrate.driver_signals import sigterm_as_ctrl_c
from raydiff.orchestrate.node_network import refuse_unreachable_gloo_nodes
from raydiff.orchestrate.node_paths import refuse_paths_nodes_cannot_see
from raydiff.orchestrate.ray_session import ensure_ray, quiet_ray_console, verbose
from raydiff.orchestrate.training_job import (
    run_training_job,
    with_absolute_data_dir,
)
from raydiff.results_table import cell, finite
from raydiff.storage import (
    StoragePath,
    check_writable,
    names_a_bucket,
    ray_storage,
    resolve_location,
    write_text_atomically,
)
from raydiff.sweep.results import (
    TrialRow,
    best_row,
    format_table,
    read_run_config,
    trial_status,
    write_best_config,
    write_csv,
)
from raydiff.sweep.spec import LoadedSweep, SearchDimension, load_sweep, trial_run_name
from raydiff.tracking import finish_parent_tracking, start_parent_tracking
from raydiff.train.checkpoint import latest_checkpoint

logger = logging.getLogger(__name__)

SWEEP_FILE = "sweep.yaml"
BASE_CONFIG_FILE = "base_config.yaml"
TRIALS_DIR = "trials"
TUNE_DIR = "tune"
TRIAL_FILE = "trial.json"

TRIAL_DRIVER_CPUS = 0.1
"""CPUs reserved for a trial's own process (it only waits on its Ray Train run)."""


class EvaluationRelay(TuneReportCallback):
    """Relay the training workers' reports that hold the sweep's metric to Tune.

    Workers report at every log, save and evaluation step; validation bits/dim only at
    evaluations. Tune refuses results without the metric it optimises, and ASHA must compare
    trials at evaluation steps, so only those reports are passed on (with the training loss
    and every other metric of that report).
    """

    def __init__(self, metric: str) -> None:
        super().__init__()
        self._metric = metric

    def after_report(
        self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any
    ) -> None:
        if metrics and self._metric in metrics[0]:
            super().after_report(run_context, metrics, checkpoint)


class TrialLifecycle(tune.Callback):
    """Progress lines for trials starting, evaluating and ending; kills a trial's loss-history
    actor when the trial ends (an early-stopped trial's process is killed, so its own clean-up
    never runs)."""

    def __init__(self, *, trials_dir: StoragePath, metric: str, max_steps: int) -> None:
        self._trials_dir = trials_dir
        self._metric = metric
        self._max_steps = max_steps

    def _name(self, trial: Any) -> str:
        return Path(trial.path).name

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        logger.info("trial %s started", self._name(trial))

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        step, value = result.get("step"), cell(result.get(self._metric))
        name = self._name(trial)
        logger.info("trial %s  step %s/%d  %s %s", name, step, self._max_steps, self._metric, value)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        step = (trial.last_result or {}).get("step")
        status = trial_status(error=None, step=step, max_steps=self._max_steps)
        logger.info("trial %s %s at step %s", self._name(trial), status, step)
        self._release(trial)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        logger.warning("trial %s failed (its error: %s/error.txt)", self._name(trial), trial.path)
        self._release(trial)

    def _release(self, trial: Any) -> None:
        from raydiff.orchestrate.loss_history_actor import kill_actor

        kill_actor(self._trials_dir / self._name(trial))


@dataclass(kw_only=True)
class SweepOutcome:
    """What :func:`start_sweep` or :func:`resume_sweep` produced."""

    rows: list[TrialRow]
    table: str
    interrupted: bool
    stopped_by: str
    """The signal that interrupted the sweep ("SIGINT": Ctrl-C, or "SIGTERM"); read when
    ``interrupted``."""
    tensorboard_dir: StoragePath
    results_csv: StoragePath | None = None
    best_config: StoragePath | None = None
    best_checkpoint: str | None = None


def _display_values(dims: tuple[SearchDimension, ...], params: dict[str, Any]) -> dict[str, Any]:
    return {d.key: params[d.field] for d in dims if d.field in params}


def _param_space(dims: tuple[SearchDimension, ...]) -> dict[str, Any]:
    make = {
        "choice": lambda v: tune.choice(list(v)),
        "grid": lambda v: tune.grid_search(list(v)),
        "uniform": lambda v: tune.uniform(*v),
        "loguniform": lambda v: tune.loguniform(*v),
        "randint": lambda v: tune.randint(*v),
    }
    return {d.field: make[d.kind](d.values) for d in dims}


def run_trial(
    params: dict[str, Any],
    *,
    loaded: LoadedSweep,
    trials_dir: StoragePath,
    manifest: Manifest,
    cached_splits: dict[str, Any],
    tracking_parent: dict[str, Any],
) -> None:
    """The Tune trainable (bound to its sweep by :func:`_tuner`): one trial = one
    ``run_training_job`` into ``trials_dir/<name>``."""
    # The driver named the trial's Tune folder (trial_run_name); its run folder is named alike.
    name = Path(tune.get_context().get_trial_dir()).name
    number = int(name.partition("_")[0][1:])  # t0004_lr-0.001 -> 4
    config = loaded.trial_config(params, trial_number=number)
    run_dir = trials_dir / name
    run_dir.mkdir(parents=True, exist_ok=True)
    # Which trial this run is, and when it (last) started.
    info = {"trial_id": tune.get_context().get_trial_id(), "params": params, "started": time.time()}
    (run_dir / TRIAL_FILE).write_text(json.dumps(info, indent=2))
    result = run_training_job(
        config,
        output_dir=run_dir,
        manifest=manifest,
        callbacks=[EvaluationRelay(loaded.sweep.metric)],
        cached_splits=cached_splits,
        tracking_parent=tracking_parent,  # the trial's tracked run is the sweep's child
    )
    if result.get("already_finished") and loaded.sweep.metric in result:
        # Interrupted after its last checkpoint but before Tune saw the last report (resumed
        # with --resume): no step ran, so say where it ended, with what its checkpoint kept.
        numbers = {k: v for k, v in result.items() if isinstance(v, int | float)}
        tune.report({k: v for k, v in numbers.items() if not isinstance(v, bool)})


def _default_concurrency(loaded: LoadedSweep) -> int:
    """Trials that fit at once: the cluster's CPUs (GPUs) over one trial's training workers,
    leaving two CPUs for Ray Data; on a new local instance, this machine's cores."""
    scaling = loaded.base_config.scaling
    if scaling.use_gpu:
        gpus = ray.cluster_resources().get("GPU", 0) if ray.is_initialized() else 0
        return max(1, int(gpus // scaling.max_workers))
    cpus = (
        ray.cluster_resources().get("CPU", 1) - 2 if ray.is_initialized() else os.cpu_count() or 1
    )
    return max(1, int(cpus // (scaling.max_workers * scaling.cpus_per_worker)))


def trial_dir_namer(out: StoragePath, dims: tuple[SearchDimension, ...]) -> Callable[[Any], str]:
    """A trial's name and folder name: its number and its values.

    Tune's trial ids are random with a search algorithm like Optuna, so the number (0, 1, 2,
    ... in the order Tune creates the trials, the same after a resume; in the folder name, and
    what the trial's seed derives from) is kept in ``trial_numbers.json`` in the sweep folder.
    Tune calls the namer in the driver, one trial at a time.
    """
    file = out / "trial_numbers.json"

    def name(trial: Any) -> str:
        numbers = json.loads(file.read_text()) if file.is_file() else {}
        if trial.trial_id not in numbers:
            numbers[trial.trial_id] = max(numbers.values(), default=-1) + 1
            write_text_atomically(file, json.dumps(numbers, indent=1))
        return trial_run_name(numbers[trial.trial_id], _display_values(dims, trial.config))

    return name


def _tuner(
    loaded: LoadedSweep,
    *,
    out: StoragePath,
    manifest: Manifest,
    concurrency: int,
    restore: bool,
) -> tune.Tuner:
    """A new sweep's ``Tuner``, or (``restore``) the interrupted one's."""
    sweep = loaded.sweep
    trials_dir = out / TRIALS_DIR
    if not verbose():
        from ray.data import DataContext

        # The cached splits carry this context into every trial: no per-operator bars there.
        DataContext.get_current().enable_progress_bars = False
    # Every trial reads the same images: decode them into the object store once, here (this
    # driver owns the blocks and outlives the trials), instead of once per trial.
    cached_splits = cache_splits(loaded.base_config.data, manifest=manifest)
    # The sweep's parent runs: created by its first start, found again by a resumed one.
    parent = start_parent_tracking(loaded.base_config, sweep_dir=out)
    # run_trial bound to this sweep, with a trial's resources.
    trial = functools.partial(
        run_trial,
        loaded=loaded,
        trials_dir=trials_dir,
        manifest=manifest,
        cached_splits=cached_splits,
        tracking_parent=parent,
    )
    trainable = tune.with_resources(trial, {"CPU": TRIAL_DRIVER_CPUS})
    if restore:
        # Finished and failed trials stay as they are; interrupted ones run again and continue
        # their own training run from its newest checkpoint.
        return tune.Tuner.restore(
            tune_path(out),
            trainable=trainable,
            storage_filesystem=ray_storage(out)[1],
            resume_unfinished=True,
            resume_errored=False,
            restart_errored=False,
        )
    name = trial_dir_namer(out, loaded.dimensions)
    return tune.Tuner(
        trainable,
        param_space=_param_space(loaded.dimensions),
        tune_config=tune.TuneConfig(
            metric=sweep.metric,
            mode=sweep.mode,
            search_alg=_search_algorithm(loaded, concurrency=concurrency),
            scheduler=_scheduler(loaded),
            num_samples=sweep.num_samples,
            max_concurrent_trials=None if sweep.search == "random" else concurrency,
            trial_name_creator=name,
            trial_dirname_creator=name,
        ),
        run_config=tune.RunConfig(
            name=TUNE_DIR,
            storage_path=ray_storage(out)[0],
            storage_filesystem=ray_storage(out)[1],
            failure_config=tune.FailureConfig(max_failures=0),
            callbacks=[
                TrialLifecycle(
                    trials_dir=trials_dir, metric=sweep.metric, max_steps=loaded.max_steps
                )
            ],
            verbose=0,  # raydiff's own progress lines (TrialLifecycle) instead of Tune's tables
        ),
    )


def _search_algorithm(loaded: LoadedSweep, *, concurrency: int) -> Any:
    """Tune's searcher for ``search``: Optuna's TPE, or random / grid variants."""
    sweep = loaded.sweep
    if sweep.search == "optuna":
        try:
            from ray.tune.search.optuna import OptunaSearch

            return OptunaSearch(seed=sweep.seed)
        except (ImportError, AssertionError):
            raise UserInputError(
                "search: optuna needs the optuna package: pip install 'raydiff[optuna]' "
                "(or use search: random)"
            ) from None
    from ray.tune.search.basic_variant import BasicVariantGenerator

    # Tune's max_concurrent_trials only limits Searchers: this generator takes its own.
    return BasicVariantGenerator(random_state=sweep.seed, max_concurrent=concurrency)


def _scheduler(loaded: LoadedSweep) -> Any:
    """Tune's trial scheduler: ASHA's early stopping on the step count, or FIFO."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    scheduler = loaded.sweep.scheduler
    if scheduler.name != "asha":
        return FIFOScheduler()
    return ASHAScheduler(
        time_attr="step",
        max_t=loaded.max_steps,
        grace_period=min(loaded.grace_period, loaded.max_steps),
        reduction_factor=scheduler.reduction_factor,
    )


def sweep_folder(flag: str, folder: str | Path) -> StoragePath:
    """The sweep folder: an absolute local path, or a URI (s3://, gs://, ...)."""
    out = resolve_location(folder)
    if names_a_bucket(out):
        raise UserInputError(
            f"{flag} {folder}: give the sweep a folder inside the bucket, e.g. {out}/sweeps/NAME"
        )
    check_writable(out, flag=flag)  # a refused bucket now, not when the first trial reports
    return out


def tune_path(out: StoragePath) -> str:
    """Tune's experiment folder as Tune takes it (with ``ray_storage(out)[1]``, the pyarrow
    filesystem Tune keeps its state on: a URI's own, or Tune's default for a local folder)."""
    return ray_storage(out / TUNE_DIR)[0]


def start_sweep(
    loaded: LoadedSweep,
    *,
    output_dir: str | Path,
    address: str | None = None,
) -> SweepOutcome:
    """Run a new sweep into ``output_dir``; refuses a folder that already holds anything."""
    out = sweep_folder("--output", output_dir)
    if (out / SWEEP_FILE).is_file():
        raise UserInputError(
            f"--output {output_dir} holds a sweep already: continue it with `raydiff sweep "
            f"--resume {output_dir}`, or choose another --output"
        )
    if out.exists() and any(out.iterdir()):
        raise UserInputError(
            f"--output {output_dir} is not empty and holds no sweep: choose a new folder "
            f"(a sweep never writes into another run's files)"
        )
    out.mkdir(parents=True, exist_ok=True)
    import yaml

    # The sweep as run: the base config resolved now (a preset may change later) and every
    # override, so that --resume rebuilds exactly the same trials.
    (out / BASE_CONFIG_FILE).write_text(to_yaml(loaded.raw_base_config))
    saved = {**loaded.source, "base": BASE_CONFIG_FILE, "set": loaded.all_overrides()}
    (out / SWEEP_FILE).write_text(yaml.safe_dump(saved, sort_keys=False))
    return _run(loaded, out=out, address=address, restore=False)


def resume_sweep(output_dir: str | Path, *, address: str | None = None) -> SweepOutcome:
    """Continue the sweep in ``output_dir`` (interrupted trials from their newest checkpoint)."""
    out = sweep_folder("--resume", output_dir)
    if not (out / SWEEP_FILE).is_file():
        raise UserInputError(
            f"--resume {output_dir}: no sweep there ({SWEEP_FILE} missing); start one with "
            f"`raydiff sweep --config SWEEP.yaml --output {output_dir}`"
        )
    with tempfile.TemporaryDirectory(prefix="raydiff-sweep-") as tmp:
        # The sweep file names its base config next to it; both read from a local copy.
        for name in (SWEEP_FILE, BASE_CONFIG_FILE):
            (Path(tmp) / name).write_text((out / name).read_text())
        loaded = load_sweep(Path(tmp) / SWEEP_FILE, manifest_for=load_manifest)
    restore = tune.Tuner.can_restore(tune_path(out), storage_filesystem=ray_storage(out)[1])
    if not restore:
        logger.warning("no Tune state in %s yet: starting its trials afresh", out / TUNE_DIR)
    return _run(loaded, out=out, address=address, restore=restore)


def _run(
    loaded: LoadedSweep,
    *,
    out: StoragePath,
    address: str | None,
    restore: bool,
) -> SweepOutcome:
    # Trials run in other working directories; the caller's sweep and config stay as they were.
    loaded = dataclasses.replace(loaded, base_config=with_absolute_data_dir(loaded.base_config))
    manifest = load_manifest(loaded.base_config.data.data_dir)
    loaded.base_config.tracking.check_installed()  # before Ray and Tune start
    scaling = loaded.base_config.scaling
    concurrency = loaded.sweep.max_concurrent_trials or _default_concurrency(loaded)
    ensure_ray(
        address=address,
        num_workers=concurrency * scaling.max_workers,
        cpus_per_worker=scaling.cpus_per_worker + TRIAL_DRIVER_CPUS / scaling.max_workers,
    )
    refuse_paths_nodes_cannot_see({"--output": out, "--data": loaded.base_config.data.data_dir})
    refuse_unreachable_gloo_nodes(use_gpu=scaling.use_gpu, num_workers=scaling.max_workers)
    quiet_ray_console()
    if not verbose():
        # Tune's newer console output prints its experiment box and paths even at verbose=0;
        # the older engine is silent at 0. raydiff prints its own lines and the table.
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    logger.info(
        "sweep %s: %s, %d sample(s), up to %d trial(s) at once, %s worker(s) each",
        out,
        ", ".join(f"{d.key} {d.kind} {list(d.values)}" for d in loaded.dimensions),
        loaded.sweep.num_samples,
        concurrency,
        "-".join(map(str, sorted({scaling.min_workers, scaling.max_workers}))),
    )
    tuner = _tuner(loaded, out=out, manifest=manifest, concurrency=concurrency, restore=restore)
    with sigterm_as_ctrl_c() as stopped:
        grid = tuner.fit()
    # After Ctrl-C (or SIGTERM, turned into it) Tune stops the running trials and marks them
    # terminated in memory, as if they had finished; the state it saved for --resume still says
    # which had not.
    analysis = tune.ExperimentAnalysis(tune_path(out), storage_filesystem=ray_storage(out)[1])
    saved = {Path(t.path).name: t.status for t in analysis.trials}
    unfinished = {name for name, status in saved.items() if status not in ("TERMINATED", "ERROR")}
    rows = [_row(loaded, out=out, result=result, unfinished=unfinished) for result in grid]
    from raydiff.orchestrate.loss_history_actor import kill_actor

    for row in rows:  # trials stopped by Ctrl-C never reach TrialLifecycle's clean-up
        kill_actor(row.run_dir)
    rows.sort(key=lambda r: r.trial)
    columns = [m.key for m in loaded.task.metrics if m.headline]
    table = format_table(rows, loaded.ranking, columns=columns)
    outcome = SweepOutcome(
        rows=rows,
        table=table,
        interrupted=bool(unfinished),
        stopped_by=stopped.name,
        tensorboard_dir=out / TRIALS_DIR,
    )
    if outcome.interrupted:
        return outcome
    outcome.results_csv = write_csv(
        rows, out / "results.csv", metric=loaded.sweep.metric, columns=columns
    )
    finish_parent_tracking(loaded.base_config, sweep_dir=out, results_csv=outcome.results_csv)
    best = best_row(rows, loaded.ranking)
    if best is not None:
        outcome.best_config = write_best_config(
            best, out / "best_config.yaml", command=loaded.task.train_command
        )
        outcome.best_checkpoint = best.checkpoint or None
    return outcome


def _row(loaded: LoadedSweep, *, out: StoragePath, result: Any, unfinished: set[str]) -> TrialRow:
    name = Path(result.path).name
    run_dir = out / TRIALS_DIR / name
    metrics = dict(result.metrics or {})
    step = metrics.get("step")
    reported = {m.key for m in loaded.task.all_metrics()}  # less Tune's own bookkeeping
    numbers = {k: float(v) for k, v in metrics.items() if k in reported and finite(v)}
    checkpoint = latest_checkpoint(run_dir)
    config = read_run_config(run_dir)
    seed = config.train.seed if config is not None else None
    return TrialRow(
        trial=name,
        values=_display_values(loaded.dimensions, dict(result.config or {})),
        seed=seed,
        status="interrupted"
        if name in unfinished
        else trial_status(error=result.error, step=step, max_steps=loaded.max_steps),
        step=step,
        metrics=numbers,
        checkpoint=str(checkpoint) if checkpoint else "",
        run_dir=str(run_dir),
    )
