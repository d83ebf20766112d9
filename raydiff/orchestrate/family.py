"""``raydiff family``: guided-diffusion's family of models trained together on one Ray cluster,
then its guided cascade sampled and judged (what runs, resuming and failures: docs/family.md).

Each stage is the single command a user would run (``raydiff train``, ``train-classifier``,
``sample``), started as its own process that joins the family's cluster (``--address``), with its
output under ``DIR/<stage>/`` and its console in ``DIR/logs/<stage>.log``; a stage starts once
the stages it needs are done, so a failed one stops only those that need it.

``DIR`` is a local folder or a URI (``s3://bucket/family``): the stages write their run folders
and samples there themselves, and a stage's console goes to a local file while it runs, copied
to ``DIR/logs/<stage>.log`` when it ends (and at each progress line), continuing the log an
earlier run of the family left there.
"""

from __future__ import annotations

import logging
import math
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

from raydiff.config import ExperimentConfig
from raydiff.errors import RunFailedError, RunInterruptedError, UserInputError
from raydiff.family.spec import Family, TrainingStage, load_family
from raydiff.storage import MirroredFolder, StoragePath, check_writable, resolve_location
from raydiff.tracking import (
    finish_parent_tracking,
    keeps_runs,
    start_parent_tracking,
    start_tracking,
)
from raydiff.train.checkpoint import latest_checkpoint

logger = logging.getLogger(__name__)

PROGRESS_SECONDS = 60.0
"""How often the console gets each running stage's last log line."""
STOP_SECONDS = 120.0
"""How long a stopped stage may take to leave before it is killed."""
POLL_SECONDS = 0.5
"""How often the running stages are looked at."""

ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
RAYLET = "(raylet)"
LOG_PREFIX = re.compile(
    r"^(\(\w+ pid=\d+\)\s*)?(\d{4}-\d\d-\d\d [\d:,]+ (\[rank \d+\] |[A-Z]+ )?[\w.]+: )?"
)
"""A worker's and a log record's prefix: a progress line shows what the record says."""

State = Literal["waiting", "running", "done", "failed", "skipped"]


@dataclass(kw_only=True)
class StageRun:
    """One stage's process(es): ``commands`` builds its ``raydiff`` command lines once the
    stages it ``needs`` are done (a command line already done is left out)."""

    name: str
    needs: tuple[str, ...]
    commands: Callable[[], list[list[str]]]
    log: Path
    """The local file its processes write their console to."""
    logs: MirroredFolder | None = None
    """The family's ``DIR/logs`` that ``log`` is copied to (None: ``log`` is kept where it is)."""
    state: State = "waiting"
    note: str = ""
    pending: list[list[str]] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = None

    def last_line(self) -> str:
        """The last line of its log that its command wrote ('' before one): Ray's raylet
        adds lines of its own to every driver's console, colours stripped."""
        if not self.log.is_file():
            return ""
        with open(self.log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 16384))
            text = ANSI_COLOUR.sub("", f.read().decode(errors="replace"))
        lines = [line.strip() for line in text.splitlines()]
        return next((line for line in reversed(lines) if line and RAYLET not in line), "")

    @property
    def kept_log(self) -> StoragePath:
        """Where its log is kept once it ended (``DIR/logs/<stage>.log``)."""
        return self.logs.target / self.log.name if self.logs else self.log

    def publish_log(self) -> None:
        """Copy its log to ``DIR/logs`` (nothing to do for a local ``DIR``: written there)."""
        if self.logs is not None and self.log.is_file():
            self.logs.publish(self.log.name)


def run_family(
    path: str, *, overrides: list[str], max_steps: int | None, output: str, address: str | None
) -> StoragePath:
    """Check the family file ``path`` (with ``--set`` ``overrides`` and ``--max-steps``), prepare
    its missing datasets, train, sample and judge it under ``output`` (a local folder or a URI);
    returns the report's path (``DIR/report.md``)."""
    out = resolve_location(output)
    # Every check that needs no data, before anything is written.
    family = load_family(path, overrides=overrides, max_steps=max_steps)
    check_writable(out, flag="--output")  # a refused bucket now, not when a stage ends
    (out / "logs").mkdir(parents=True, exist_ok=True)
    logs = MirroredFolder(out / "logs")
    try:
        return _run_family(
            family,
            path=path,
            overrides=overrides,
            max_steps=max_steps,
            out=out,
            logs=logs,
            address=address,
        )
    finally:
        logs.close()


def _run_family(
    family: Family,
    *,
    path: str,
    overrides: list[str],
    max_steps: int | None,
    out: StoragePath,
    logs: MirroredFolder,
    address: str | None,
) -> StoragePath:
    """:func:`run_family` once its folder is there: the datasets, the stages, the report."""
    import ray

    from raydiff.data.prepare import prepare_dataset
    from raydiff.evaluate.family_report import write_family_report
    from raydiff.orchestrate.node_paths import refuse_paths_nodes_cannot_see
    from raydiff.orchestrate.ray_session import ensure_ray

    for name in family.waiting_for_data:
        logger.info("preparing the dataset %s (once)", name)
        print(prepare_dataset(family.datasets[name]).format())
    # Again, once its datasets are prepared: the checks that need the data (classes, channels).
    family = load_family(path, overrides=overrides, max_steps=max_steps)
    # A local instance holds every training's workers at once (ensure_ray adds Ray Data's).
    cpus = sum(
        s.config.scaling.worker_sizes[0] * s.config.scaling.cpus_per_worker
        for s in family.stages.values()
    )
    ensure_ray(address=address, num_workers=math.ceil(cpus), cpus_per_worker=1.0)
    # Each stage's training checks its own folders too; this refuses before any stage starts.
    refuse_paths_nodes_cannot_see({"--output": out})
    tracked = start_family_tracking(family, out=out)
    # The stages' processes join the address given, else the local instance started here.
    address = address or ray.get_runtime_context().gcs_address
    stages = _stage_runs(family, out=out, logs=logs, address=address)
    run_stages(stages, out=out)
    done = {s.name for s in stages if s.state == "done"}
    if {"sample", "evaluator"} <= done:
        logger.info("evaluate: judging the samples in the evaluator's features")
        write_family_report(family, out=out)
        if tracked is not None:
            finish_parent_tracking(tracked, sweep_dir=out, results_csv=out / "report.csv")
    raise_if_failed(stages)
    return out / "report.md"


def start_family_tracking(family: Family, *, out: StoragePath) -> ExperimentConfig | None:
    """With a tracking backend that has runs (a stage's ``tracking.backend``: MLflow, W&B): the
    family's parent runs (in ``DIR/tracking.json``), and each tracked stage's run as their child
    (its run folder's ``tracking.json``, which its command then continues); the config whose
    tracking settings the parent took (None: nothing tracked)."""
    tracked = [stage for stage in family.stages.values() if keeps_runs(stage.config)]
    if not tracked:
        return None
    config = tracked[0].config
    parent = start_parent_tracking(config, sweep_dir=out)
    for stage in tracked:
        start_tracking(stage.config, run_dir=out / stage.name, parent=parent)
    return config


def _stage_runs(
    family: Family, *, out: StoragePath, logs: MirroredFolder, address: str
) -> list[StageRun]:
    """Every stage of ``family``: its trainings, then ``sample``; their logs in ``logs``."""
    runs = [
        StageRun(
            name=stage.name,
            needs=(),
            commands=lambda stage=stage: _training_commands(stage, out=out, address=address),
            log=logs.local / f"{stage.name}.log",
            logs=logs,
        )
        for stage in family.stages.values()
    ]
    needs = tuple(name for name in ("base", "classifier", "upsampler") if name in family.stages)
    runs.append(
        StageRun(
            name="sample",
            needs=needs,
            commands=lambda: sample_commands(family, out=out, address=address),
            log=logs.local / "sample.log",
            logs=logs,
        )
    )
    return runs


def _training_commands(stage: TrainingStage, *, out: StoragePath, address: str) -> list[list[str]]:
    """The stage's training command, unless its run has a checkpoint at ``max_steps`` (or
    later)."""
    checkpoint = latest_checkpoint(out / stage.name)
    if checkpoint is not None and _step(checkpoint) >= stage.config.train.max_steps:
        return []
    return [stage.argv(output=str(out / stage.name), address=address)]


def _step(checkpoint: StoragePath) -> int:
    return int(checkpoint.name.split("_")[-1])


def final_checkpoint(out: StoragePath, stage: str) -> StoragePath:
    """The newest checkpoint of stage ``stage``'s run."""
    checkpoint = latest_checkpoint(out / stage)
    if checkpoint is None:
        raise RunFailedError(f"stage {stage} finished without a checkpoint under {out / stage}")
    return checkpoint


def sample_commands(family: Family, *, out: StoragePath, address: str) -> list[list[str]]:
    """The ``raydiff sample`` runs of the ``sample`` stage whose samples are not written yet:
    the guided cascade (``DIR/sample/guided``) and, with a classifier, the unguided one
    (``DIR/sample/unguided``); each writes its base samples and its upsampled ones."""
    options = family.sample

    def weights(flag: str, name: str | None) -> list[str]:
        return [flag, name] if name else []

    common = [
        "sample",
        "--checkpoint",
        str(final_checkpoint(out, "base")),
        *("--num-samples", str(options.num_samples)),
        *("--timestep-respacing", options.timestep_respacing),
        "--use-ddim" if options.use_ddim else "--no-use-ddim",
        *("--batch-size", str(options.batch_size)),
        *("--num-workers", str(options.num_workers)),
        *("--seed", str(options.seed)),
        *weights("--weights", options.weights),
        *("--address", address),
    ]
    if "upsampler" in family.stages:
        common += [
            *("--upsampler", str(final_checkpoint(out, "upsampler"))),
            *("--upsampler-respacing", options.upsampler_respacing),
            *(("--upsampler-use-ddim",) if options.upsampler_use_ddim else ()),
            *weights("--upsampler-weights", options.upsampler_weights),
        ]
    runs = {"unguided": common}
    if "classifier" in family.stages:
        guidance = [
            *("--classifier", str(final_checkpoint(out, "classifier"))),
            *("--classifier-scale", str(options.classifier_scale)),
            *weights("--classifier-weights", options.classifier_weights),
        ]
        runs = {"guided": [*common, *guidance], **runs}
    sampling = [
        [*argv, "--out", str(out / "sample" / name)]
        for name, argv in runs.items()
        if not samples_written(out / "sample" / name)
    ]
    return [*posthoc_ema_commands(family, out=out), *sampling] if sampling else []


POSTHOC_PREFIX = "phema_"


def posthoc_ema_commands(family: Family, *, out: StoragePath) -> list[list[str]]:
    """``raydiff ema`` for each ``phema_<length>`` weights the ``sample`` stage names that its
    model's final checkpoint does not hold yet (a model trained with
    ``optim.posthoc_ema_stds``): the family chooses each model's EMA length after training."""
    options = family.sample
    named = {
        "base": options.weights,
        "classifier": options.classifier_weights,
        "upsampler": options.upsampler_weights,
    }
    commands = []
    for stage, weights in named.items():
        if not weights or not weights.startswith(POSTHOC_PREFIX) or stage not in family.stages:
            continue
        checkpoint = final_checkpoint(out, stage)
        if not (checkpoint / f"{weights}.pt").is_file():
            length = weights.removeprefix(POSTHOC_PREFIX)
            step = str(_step(checkpoint))
            commands.append(
                ["ema", "--run", str(out / stage), "--sigma-rel", length, "--step", step]
            )
    return commands


def samples_written(folder: StoragePath) -> bool:
    """Whether a ``raydiff sample`` run (a cascade's too) finished writing into ``folder``."""
    from raydiff.sample.outputs import is_npz_name

    last = folder / "upsampled" if (folder / "upsampled").exists() else folder
    return last.is_dir() and any(is_npz_name(p.name) for p in last.iterdir())


Launch = Callable[[list[str], IO[bytes]], subprocess.Popen[bytes]]
"""Starts one ``raydiff`` command line of a stage, its console going to the stage's log."""


def launch_command(argv: list[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    """``raydiff ARGV`` as a process of its own. A session of its own: a Ctrl-C at the terminal
    reaches this process only, which passes it on to each stage once (_stop_all)."""
    return subprocess.Popen(
        [sys.executable, "-m", "raydiff.cli", *argv],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def run_stages(
    stages: list[StageRun], *, out: StoragePath, launch: Launch = launch_command
) -> None:
    """Start each stage once what it needs is done, until none is waiting or running; a stop
    signal is passed on to every running stage. Needs no Ray: the stages' commands join it."""
    from raydiff.orchestrate.driver_signals import StopSignal, sigterm_as_ctrl_c

    stopped = StopSignal()
    last_progress = time.monotonic()
    try:
        with sigterm_as_ctrl_c() as stopped:
            while any(s.state in ("waiting", "running") for s in stages):
                for stage in stages:
                    _advance(stage, stages, launch=launch)
                if time.monotonic() - last_progress > PROGRESS_SECONDS:
                    last_progress = time.monotonic()
                    for stage in stages:  # each running stage's last log line
                        if stage.state == "running":
                            line = LOG_PREFIX.sub("", stage.last_line())[:160]
                            logger.info("%s: %s", stage.name, line)
                            stage.publish_log()  # a bucket's reader sees how far it is
                time.sleep(POLL_SECONDS)
    except KeyboardInterrupt as error:
        running = _stop_all(stages, sigterm=stopped.sigterm)
        raise RunInterruptedError(
            f"stopped by {stopped.described}; stopped the stages {', '.join(running) or '-'} "
            f"(logs in {out / 'logs'}); run the same command again to continue",
            signal_name=stopped.name,
        ) from error


def _advance(stage: StageRun, stages: list[StageRun], *, launch: Launch) -> None:
    """One look at ``stage``: start it, start its next command, or note how it ended."""
    states = {s.name: s.state for s in stages}
    if stage.state == "waiting":
        failed = [name for name in stage.needs if states[name] in ("failed", "skipped")]
        if failed:
            _finish(stage, "skipped", f"needs {', '.join(failed)}, which did not finish")
        elif all(states[name] == "done" for name in stage.needs):
            try:
                stage.pending = stage.commands()
            except (UserInputError, RunFailedError) as error:  # e.g. a stage left no checkpoint
                _finish(stage, "failed", str(error))
                return
            stage.state = "running"
            if not stage.pending:
                _finish(stage, "done", "finished before: skipped")
            else:
                _start_next(stage, launch=launch)
        return
    if stage.state != "running" or stage.process is None:
        return
    code = stage.process.poll()
    if code is None:
        return
    if code != 0:
        _finish(stage, "failed", f"exit status {code}: {stage.last_line()}")
    elif stage.pending:
        _start_next(stage, launch=launch)
    else:
        _finish(stage, "done", "finished")


def _start_next(stage: StageRun, *, launch: Launch) -> None:
    argv = stage.pending.pop(0)
    if stage.log_file is None:
        if stage.logs is not None:  # continued after what an earlier run of the family wrote
            stage.logs.fetch(stage.log.name)
        stage.log_file = open(stage.log, "ab")  # noqa: SIM115 - open while the stage runs
    stage.log_file.write(f"$ raydiff {' '.join(argv)}\n".encode())
    stage.log_file.flush()
    kept = "" if stage.kept_log == stage.log else f", copied to {stage.kept_log} when it ends"
    logger.info("%s: raydiff %s started (log: %s%s)", stage.name, argv[0], stage.log, kept)
    stage.process = launch(argv, stage.log_file)


def _finish(stage: StageRun, state: State, note: str) -> None:
    stage.state, stage.note = state, note
    if stage.log_file is not None:
        stage.log_file.close()
        stage.log_file = None
        stage.publish_log()
    shown = logger.error if state == "failed" else logger.info
    shown("%s: %s", stage.name, note)


def _stop_all(stages: list[StageRun], *, sigterm: bool) -> list[str]:
    """Pass the stop on to every running stage and wait for each to leave (killed after
    :data:`STOP_SECONDS`); the names of the stages stopped."""
    running = [s for s in stages if s.process is not None and s.process.poll() is None]
    for stage in running:
        stage.process.send_signal(signal.SIGTERM if sigterm else signal.SIGINT)  # type: ignore[union-attr]
    deadline = time.monotonic() + STOP_SECONDS
    for stage in running:
        try:
            stage.process.wait(timeout=max(1.0, deadline - time.monotonic()))  # type: ignore[union-attr]
        except subprocess.TimeoutExpired:
            stage.process.kill()  # type: ignore[union-attr]
        _finish(stage, "failed", "stopped")
    return [s.name for s in running]


def raise_if_failed(stages: list[StageRun]) -> None:
    """Fail naming each failed stage (its last line and log), the stages not run and those
    finished."""
    failed = [s for s in stages if s.state == "failed"]
    if not failed:
        return
    finished = [s.name for s in stages if s.state == "done"]
    lines = [f"stage {s.name} failed ({s.note}); its log: {s.kept_log}" for s in failed]
    skipped = [s.name for s in stages if s.state == "skipped"]
    raise RunFailedError(
        "; ".join(lines)
        + (f"; not run: {', '.join(skipped)}" if skipped else "")
        + f"; finished: {', '.join(finished) or '-'}. Run the same command again to continue"
    )
