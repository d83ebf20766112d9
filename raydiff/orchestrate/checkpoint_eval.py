"""Evaluate each new checkpoint while the run trains, on a Ray actor beside the workers
(docs/evaluation.md): Ray Train's controller queues each reported checkpoint on the run's
:class:`CheckpointEvaluator` and returns at once, so training never waits. The driver waits for
the last one's evaluation when ``fit()`` returns (on a local instance Ray goes down with it).
"""

from __future__ import annotations

import logging
import time
from pathlib import PurePosixPath
from typing import Any

import ray
from ray.train.v2.api.callback import UserCallback

from raydiff.config import ExperimentConfig
from raydiff.storage import StoragePath

logger = logging.getLogger(__name__)

GRACE_S = 60.0
"""How long the driver waits for an evaluation request that has not arrived (a run whose last
report never reached the controller) before it gives up."""


@ray.remote(concurrency_groups={"evaluate": 1, "status": 1})
class CheckpointEvaluator:
    """Evaluates checkpoints one at a time; ``status`` calls answer while one runs."""

    def __init__(self, config: ExperimentConfig, run_dir: StoragePath, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        self.options = config.evaluation
        self.run_dir = run_dir
        self.requested: set[int] = set()
        self.results: dict[int, dict[str, Any]] = {}

    @ray.method(concurrency_group="status")
    def announce(self, step: int) -> None:
        """A checkpoint of ``step`` is on its way (the request itself may queue behind others)."""
        self.requested.add(step)

    @ray.method(concurrency_group="evaluate")
    def evaluate(self, name: str, step: int) -> dict[str, Any]:
        """Evaluate the run's checkpoint folder ``name`` (local, or under the run's URI)."""
        from raydiff.evaluate.checkpoint import evaluate_checkpoint

        self.requested.add(step)
        checkpoint = self.run_dir / name
        try:
            result = evaluate_checkpoint(
                checkpoint,
                run_dir=self.run_dir,
                step=step,
                options=self.options,
            )
        except Exception as error:  # an evaluation must never take the run down
            if not checkpoint.is_dir():
                reason = (
                    "the checkpoint was removed before its turn (scaling.checkpoints_to_keep "
                    "keeps fewer checkpoints than evaluations lag behind)"
                )
            else:
                reason = f"{type(error).__name__}: {error}"
            logging.getLogger("raydiff").warning("evaluation of %s failed: %s", checkpoint, reason)
            result = {"step": step, "checkpoint": str(checkpoint), "error": reason}
        self.results[step] = result
        return result

    @ray.method(concurrency_group="status")
    def status(self) -> tuple[set[int], dict[int, dict[str, Any]]]:
        return set(self.requested), dict(self.results)


class CheckpointEvaluationCallback(UserCallback):
    """Queues every reported checkpoint on the run's evaluator (runs in the Train controller)."""

    def __init__(self, evaluator: Any) -> None:
        self.evaluator = evaluator

    def after_report(
        self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any
    ) -> None:
        if checkpoint is None:
            return
        step = int(metrics[0]["step"])
        self.evaluator.announce.remote(step)
        # Ray Train keeps the checkpoint in the run folder (a filesystem path, no URI scheme,
        # for a run under a URI): the evaluator finds it there by name.
        self.evaluator.evaluate.remote(PurePosixPath(checkpoint.path).name, step)


def wait_for_evaluations(evaluator: Any, *, last_step: int) -> dict[str, Any] | None:
    """Block until the checkpoint of ``last_step`` is evaluated; its result (None if it was
    never requested within ``GRACE_S``)."""
    started = time.monotonic()
    announced = False
    while True:
        requested, results = ray.get(evaluator.status.remote())
        if last_step in results:
            return results[last_step]
        if last_step in requested and not announced:
            pending = sorted(s for s in requested if s not in results)
            logger.info(
                "training done; waiting for the evaluation of checkpoint(s) at step %s",
                ", ".join(map(str, pending)),
            )
            announced = True
        if last_step not in requested and time.monotonic() - started > GRACE_S:
            logger.warning("no evaluation of step %d was requested; not waiting for it", last_step)
            return None
        time.sleep(1.0)
