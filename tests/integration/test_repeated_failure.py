"""A run whose restarted worker group fails the same way stops at once (2 Ray workers).

Rank 0's task raises the same ValueError at the run's first evaluation (step 6) every time:
with ``scaling.max_failures=3`` Ray Train restarts the group once from checkpoint 4, the error
recurs at step 6, and the run stops there with one line saying so, instead of repeating steps
5-6 three more times. This also pins what ``raydiff.orchestrate.repeated_failure`` relies on in
Ray Train: a ``UserCallback`` error raised in ``after_exception`` ends ``fit()`` with a
``ControllerError`` carrying it, without a retry. Lost workers and nodes are still retried:
tests/integration/test_faults.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_training import tiny_config

from raydiff.config import ExperimentConfig, from_dict
from raydiff.errors import RunFailedError


def test_the_same_error_at_the_same_step_after_a_restart_stops_the_run(
    ray_cluster: None, tiny_dataset, tmp_path: Path
) -> None:
    from raydiff.orchestrate.training_job import run_training_job

    raised = tmp_path / "raised"  # one line per raise: the worker's pid

    def failing_evaluation(config: ExperimentConfig, *, runtime: object) -> object:
        """The diffusion task, whose evaluation on rank 0 raises (rank 1 then waits in the
        sum of the totals until the group is stopped). A local function: Ray pickles it by
        value to the workers."""
        from raydiff.train.tasks import task_of_config

        task = task_of_config(config, runtime=runtime)
        if runtime.rank == 0:

            def evaluate(model, batches, *, seed):
                with open(raised, "a") as log:
                    log.write(f"{os.getpid()}\n")
                raise ValueError("a deterministic bug in the evaluation")

            task.evaluate = evaluate
        return task

    config = tiny_config(
        tiny_dataset.path,
        **{
            "train.max_steps": 8,
            "train.save_interval": 4,
            "train.eval_interval": 6,
            "data.val_split": "val",
            "scaling.max_failures": 3,
        },
    )
    out = tmp_path / "run"
    with pytest.raises(RunFailedError) as caught:
        run_training_job(
            from_dict(ExperimentConfig, config), output_dir=out, make_task=failing_evaluation
        )
    message = str(caught.value)
    assert message.startswith(
        "training stopped (scaling.max_failures=3): rank 0: ValueError: a deterministic bug in "
        "the evaluation recurred at step 6, where the worker group before failed the same way, "
        "so retrying would not help. The last complete checkpoint is "
        f"{out / 'checkpoint_000004'} (step 4)"
    ), message
    # The first group and one restart, each on its own rank-0 process; not 1 + 3 restarts.
    pids = raised.read_text().split()
    assert len(pids) == 2 and len(set(pids)) == 2, pids
