"""The one training loop: every Ray Train worker, ``--single-process`` and sweep trials run it.

``run_loop(config, runtime=..., output_dir=...)`` builds the task and its trainer, continues from
the runtime's checkpoint if there is one, then steps until ``train.max_steps``: metrics every
``log_interval`` steps, validation every ``eval_interval``, previews (EMA sample grids) every
``sample_interval``, a checkpoint every ``save_interval``, and all of them at the last step.
What is trained (model, loss, validation, preview) is the task's business
(:class:`raydiff.train.task.Task`: by default the one ``train.task`` names); where it runs (rank, data,
collectives, how checkpoints are stored) is the :class:`raydiff.train.runtime.Runtime`'s. No Ray
here. What the main rank writes under ``output_dir`` (``raydiff.train.run_files``):
docs/training.md, "What a run writes".
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterator
from typing import Any

import torch

from raydiff.config import ExperimentConfig, to_dict
from raydiff.seeding import derive_seed
from raydiff.storage import StoragePath, local_copy
from raydiff.train.build import build_rank_optimizer
from raydiff.train.checkpoint import load_checkpoint
from raydiff.train.compilation import LoopCompilation
from raydiff.train.data_position import DataPosition
from raydiff.train.failure import note_step
from raydiff.train.rank_optimizer import StepResult
from raydiff.train.reporting import MetricAccumulator, ThroughputWindow, format_eta, headline_fields
from raydiff.train.run_files import RunFiles
from raydiff.train.runtime import Runtime
from raydiff.train.task import Batch, TaskFactory
from raydiff.train.tasks import task_of_config, task_spec
from raydiff.train.validation import rank_rows, weights_swapped

logger = logging.getLogger(__name__)

VAL_BATCH_SIZE = 64
"""Images per forward pass of the validation estimate (per rank)."""


def run_loop(
    config: ExperimentConfig,
    *,
    runtime: Runtime,
    output_dir: StoragePath,
    make_task: TaskFactory = task_of_config,
) -> dict[str, Any]:
    """Train ``make_task(config)`` until ``config.train.max_steps``; returns the last reported
    metrics (main rank)."""
    return TrainingLoop(config, runtime=runtime, output_dir=output_dir, make_task=make_task).run()


def is_due(step: int, interval: int) -> bool:
    """Whether an action every ``interval`` steps (0: never) falls on ``step``."""
    return interval > 0 and step % interval == 0


class TrainingLoop:
    """One rank's run, step by step. Every rank calls :meth:`Runtime.report` at the same steps
    (the runtime's contract), so which steps report depends on the step number only."""

    def __init__(
        self,
        config: ExperimentConfig,
        *,
        runtime: Runtime,
        output_dir: StoragePath,
        make_task: TaskFactory,
    ) -> None:
        self.config, self.train = config, config.train
        self.spec = task_spec(config.train.task)
        # Post-hoc EMA snapshots: every optim.posthoc_ema_interval steps (or save_interval's).
        self.snapshot_interval = config.optim.posthoc_ema_interval or config.train.save_interval
        self.runtime = runtime
        self.output_dir = output_dir
        self.make_task = make_task
        self.files: RunFiles | None = None  # the main rank's
        self.last_report: dict[str, Any] = {}

    def run(self) -> dict[str, Any]:
        self.at_step = 0  # the step in progress (0: building)
        try:
            return self.run_steps()
        except Exception as error:
            # Where it failed: a restarted worker group that fails the same way at the same
            # step stops the run (raydiff.train.failure).
            note_step(error, step=self.at_step)
            raise

    def run_steps(self) -> dict[str, Any]:
        """Build, then train step by step until ``train.max_steps``."""
        self.build()
        if self.optimizer.step >= self.train.max_steps:
            logger.warning(
                "the run is already at step %d >= train.max_steps=%d: nothing to train (raise "
                "--max-steps to continue it, or choose another --output for a new run)",
                self.optimizer.step,
                self.train.max_steps,
            )
            return {"step": self.optimizer.step}
        self.at_step = self.optimizer.step + 1
        self.start()
        with self.compilation.in_use():
            while self.optimizer.step < self.train.max_steps:
                self.at_step = self.optimizer.step + 1
                epoch, result = self.train_step()
                self.after_step(epoch, result)
        if self.files is not None:
            self.files.close()
        return self.last_report

    def build(self) -> None:
        """The task and its trainer, continued from the runtime's checkpoint if it has one."""
        resume = self.runtime.resume_from()
        with local_copy(resume) as path:  # under a URI: every rank downloads it
            state = load_checkpoint(path) if path is not None else None
        self.task, self.optimizer = build_rank_optimizer(
            self.config, runtime=self.runtime, make_task=self.make_task, fresh=state is None
        )
        self.raw_model = self.optimizer.raw_model
        self.compilation = LoopCompilation(
            self.optimizer, run_dir=self.output_dir, is_main=self.runtime.is_main
        )
        self.position = DataPosition()
        if state is not None:  # weights, averages, optimiser, scaler, sampler, step; data position
            self.optimizer.restore(state)
            self.position = DataPosition.from_state(
                state["trainer"], global_batch=self.train.batch_size
            )
            logger.info("resumed from %s at step %d", resume, self.optimizer.step)

    def start(self) -> None:
        """The data from the run's position, the main rank's files, the metric windows."""
        if self.position.batches:
            logger.info(
                "continuing epoch %d after its first %d batches",
                self.position.epoch,
                self.position.batches,
            )
        self.batches: Iterator[tuple[int, Batch]] = self.runtime.train_batches(
            batch_size=self.optimizer.local_batch_size, position=self.position
        )
        if self.runtime.is_main:
            self.files = RunFiles(
                self.config, output_dir=self.output_dir, start_step=self.optimizer.step
            )
        self.metrics = MetricAccumulator(num_timesteps=self.task.diffusion.num_timesteps)
        self.window = ThroughputWindow(self.train.batch_size)
        self.run_start, self.start_step = time.perf_counter(), self.optimizer.step
        self.raw_model.train()
        asked, held = self.train.eval_num_images, self.runtime.num_val_images
        if self.runtime.is_main and 0 < held < asked:
            logger.info(
                "validation uses the val split's %d images (train.eval_num_images=%d asks for "
                "more)",
                held,
                asked,
            )

    def train_step(self) -> tuple[int, StepResult]:
        """The next batch, one optimiser step over it; returns the batch's epoch and the step."""
        self.window.begin()
        epoch, batch = next(self.batches)
        self.window.data_ready()
        self.position.advance(epoch)
        began = time.perf_counter()
        result = self.optimizer.optimize(batch)
        self.window.end()
        self.compilation.after_step(step=self.optimizer.step, seconds=time.perf_counter() - began)
        self.metrics.add_step(result)
        if self.files is not None:
            # The objective this step optimised: importance-weighted, as the logged means.
            step_loss = (result.losses["loss"] * result.weights).mean()
            self.files.add_step_loss(self.optimizer.step, step_loss)
        return epoch, result

    def after_step(self, epoch: int, result: StepResult) -> None:
        """Preview, then (at a log, eval or save step) metrics, validation, progress line and
        checkpoint, in one report every rank makes."""
        step, train = self.optimizer.step, self.train
        last = step == train.max_steps
        preempted = None if last else self.runtime.preemption_notice(step=step)
        if preempted is not None:
            logger.warning("preemption notice at step %d: %s; checkpointing now", step, preempted)
        is_log = is_due(step, train.log_interval) or last
        is_save = is_due(step, train.save_interval) or last or preempted is not None
        is_eval = is_due(step, train.eval_interval) or last
        if self.runtime.is_main and (is_due(step, train.sample_interval) or last):
            self.preview()
        posthoc = self.optimizer.posthoc_ema  # the main rank's only
        if posthoc is not None and (is_due(step, self.snapshot_interval) or last):
            assert self.files is not None
            self.files.write_posthoc_snapshot(posthoc.snapshot(), step=step)
        if not (is_log or is_save or is_eval):
            return
        report: dict[str, Any] = {"step": step}
        if is_log or is_save:
            report.update(self.step_metrics(epoch, result))
        if is_eval:
            report.update(self.evaluate())
        if self.files is not None:
            self.log(report, publish_now=is_save)
        checkpoint = self.checkpoint(report) if is_save else None
        self.runtime.report(report, step=step, checkpoint=checkpoint)
        if checkpoint is not None and self.files is not None:
            self.files.log_checkpoint(step)  # saved once report returned
        self.last_report.update(report)
        if preempted is not None:
            logger.warning("step %d saved; waiting for the worker group's restart", step)
            self.runtime.await_preemption()

    def step_metrics(self, epoch: int, result: StepResult) -> dict[str, Any]:
        """Loss terms over every rank's samples since the last report (a collective; grad_norm
        is identical on all ranks), the optimiser's state and the throughput."""
        return {
            **self.metrics.flush(reduce=self.runtime.all_reduce_sum),
            "epoch": epoch,
            "lr": result.lr,
            "loss_scale": result.loss_scale,
            "skipped_steps": self.optimizer.skipped_steps,
            **self.window.read(),
        }

    def log(self, report: dict[str, Any], *, publish_now: bool) -> None:
        """The trackers (TensorBoard, ...) and the progress line (main rank)."""
        assert self.files is not None
        step = report["step"]
        loss_aware = self.train.schedule_sampler != "uniform"
        weights = self.optimizer.sampler.weights() if loss_aware else None
        self.files.write_report(report, step=step, sampler_weights=weights)
        elapsed = time.perf_counter() - self.run_start
        eta = elapsed / max(step - self.start_step, 1) * (self.train.max_steps - step)
        logger.info(
            "step %d/%d  %s  eta %s",
            step,
            self.train.max_steps,
            headline_fields(report, task=self.spec),
            format_eta(eta),
        )
        self.files.trackers.flush(now=publish_now)  # now: whatever their intervals

    def evaluate(self) -> dict[str, float]:
        """The task's validation of the evaluation (EMA) weights: every rank its share of the
        images, the totals summed over ranks (a collective)."""
        train, runtime = self.train, self.runtime
        rows = rank_rows(
            min(train.eval_num_images, runtime.num_val_images),
            rank=runtime.rank,
            world_size=runtime.world_size,
        )
        val = runtime.val_batches(rows=rows, batch_size=VAL_BATCH_SIZE)
        # A rank without rows still evaluates (its task's zero totals): every rank takes part
        # in the sum, with the same keys. In fp32 whatever train.precision: bits/dim and the
        # losses are precision-sensitive, and compare across runs only in one precision.
        with (
            torch.no_grad(),
            weights_swapped(self.raw_model, self.optimizer.eval_weights()),
            self.compilation.model_for("validation") as model,
        ):
            totals = self.task.evaluate(
                model, val, seed=derive_seed(train.seed, "val-noise", runtime.rank)
            )
        totals = runtime.all_reduce_sum(totals)
        return self.task.evaluation_metrics(totals) if float(totals["count"]) > 0 else {}

    def preview(self) -> None:
        """The task's preview of the evaluation (EMA) weights, written by the main rank (no
        collective: any step may draw one)."""
        assert self.files is not None
        with (
            torch.no_grad(),
            weights_swapped(self.raw_model, self.optimizer.eval_weights()),
            self.compilation.model_for("preview") as model,
        ):
            images = self.task.preview(model, seed=derive_seed(self.train.seed, "sample-grid"))
        if images is not None:
            self.files.write_preview(
                images, step=self.optimizer.step, columns=self.task.preview_columns
            )

    def checkpoint(self, report: dict[str, Any]) -> functools.partial[dict[str, Any]]:
        """Check that all ranks hold the same weights (a collective), then the function that
        gives the checkpoint's contents (the runtime calls it on the main rank only); ``report``:
        the metrics reported with it, kept in the checkpoint."""
        fingerprints = self.optimizer.rank_fingerprints(self.runtime.all_reduce_sum)
        return functools.partial(self.checkpoint_files, fingerprints, dict(report))

    def checkpoint_files(
        self, fingerprints: list[list[float]], report: dict[str, Any]
    ) -> dict[str, Any]:
        """What a checkpoint holds (main rank; a loss-history actor is read here)."""
        state = self.optimizer.checkpoint()
        state["trainer"].update(self.position.state(global_batch=self.train.batch_size))
        # Evidence that every rank held these weights: one fingerprint per rank, all equal.
        state["trainer"]["rank_weight_fingerprints"] = fingerprints
        return {
            "model_state": state["model"],
            "ema_states": state["ema"],
            "trainer_state": state["trainer"],
            "config": to_dict(self.config),
            "metrics": report,
        }
