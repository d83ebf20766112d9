"""A restarted worker group that fails as the one before did stops the run: the step the loop
notes on its errors, the comparison of one group's failures with the last one's, and the
driver's one-line error (no Ray: the controller's side is tests/integration/
test_repeated_failure.py)."""

from __future__ import annotations

import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tiny_model import tiny_model

from raydiff.config import ExperimentConfig, apply_overrides
from raydiff.train.failure import (
    FailureHistory,
    LoopFailure,
    RepeatedFailureError,
    note_step,
    step_of,
)


def raised(error: BaseException, step: int | None) -> BaseException:
    """``error`` as a worker's loop hands it to Ray (noted, pickled, unpickled); step None: an
    error the loop did not raise (a lost worker)."""
    if step is not None:
        note_step(error, step=step)
    return pickle.loads(pickle.dumps(error))


def test_the_step_noted_on_an_error_survives_pickling_and_the_innermost_note_stays() -> None:
    error = ValueError("boom")
    note_step(error, step=6)
    note_step(error, step=9)  # an outer handler's later note does not move it
    again = pickle.loads(pickle.dumps(error))
    assert step_of(again) == 6 and str(again) == "boom"
    assert step_of(ValueError("no note")) is None
    assert LoopFailure.of(ValueError("no note")) is None
    assert LoopFailure.of(again) == LoopFailure(type="builtins.ValueError", message="boom", step=6)


def test_the_same_error_at_the_same_step_after_a_restart_is_a_repeat() -> None:
    history = FailureHistory()
    assert history.repeat({0: raised(ValueError("boom"), 6)}) is None  # the first failure
    repeat = history.repeat({0: raised(ValueError("boom"), 6)})
    assert isinstance(repeat, RepeatedFailureError)
    assert (repeat.rank, repeat.failure.step) == (0, 6)
    assert str(repeat) == (
        "rank 0: ValueError: boom recurred at step 6, where the worker group before failed the "
        "same way, so retrying would not help"
    )
    again = pickle.loads(pickle.dumps(repeat))  # as the controller's error reaches the driver
    assert (again.rank, again.failure, str(again)) == (0, repeat.failure, str(repeat))


@pytest.mark.parametrize(
    ("second", "step"),
    [(ValueError("boom"), 7), (ValueError("bang"), 6), (TypeError("boom"), 6)],
    ids=["another step", "another message", "another type"],
)
def test_an_error_that_differs_in_type_message_or_step_is_no_repeat(second, step) -> None:
    history = FailureHistory()
    history.repeat({0: raised(ValueError("boom"), 6)})
    assert history.repeat({0: raised(second, step)}) is None


def test_a_lost_worker_is_never_a_repeat_and_is_not_remembered() -> None:
    """A group with an error the loop did not raise (a dead actor) was cut short from outside:
    its ranks' errors (collateral, however alike) are not compared, and the next group is
    compared with the last one that failed by itself."""
    history = FailureHistory()
    died = RuntimeError("The actor died unexpectedly")  # no step note: not the loop's
    collateral = {0: raised(died, None), 1: raised(RuntimeError("Connection closed"), 9)}
    assert history.repeat(collateral) is None
    assert history.repeat(collateral) is None  # the same loss at the same step: retried
    assert history.repeat({1: raised(ValueError("boom"), 6)}) is None
    assert history.repeat({0: raised(died, None)}) is None
    assert isinstance(history.repeat({1: raised(ValueError("boom"), 6)}), RepeatedFailureError)
    assert history.repeat({}) is None


def test_one_failure_in_common_is_a_repeat_whichever_ranks_fail_beside_it() -> None:
    """Rank 0 raises at step 6; rank 1, cut short in a collective, may or may not have failed
    by the time Ray Train looks."""
    history = FailureHistory()
    assert history.repeat({0: raised(ValueError("boom"), 6)}) is None
    repeat = history.repeat(
        {1: raised(RuntimeError("Connection closed by peer"), 6), 0: raised(ValueError("boom"), 6)}
    )
    assert repeat is not None and repeat.rank == 0


def test_a_repeat_before_the_first_step_says_so() -> None:
    history = FailureHistory()
    history.repeat({0: raised(OSError("no such file"), 0)})
    repeat = history.repeat({0: raised(OSError("no such file"), 0)})
    assert repeat is not None and "recurred at the start, before the first step" in str(repeat)


def test_a_long_message_is_quoted_as_one_short_line() -> None:
    failure = LoopFailure(type="builtins.ValueError", message="\n" + "x" * 300 + "\nmore", step=1)
    assert failure.describe() == "ValueError: " + "x" * 197 + "..."


class FailingEvaluation:
    """The diffusion task whose evaluation raises."""

    def __init__(self, task) -> None:
        self.task = task

    def __getattr__(self, name: str):
        return getattr(self.task, name)

    def evaluate(self, model, batches, *, seed: int):
        raise ValueError("the evaluation failed")


def test_the_loop_notes_the_step_it_failed_in(tmp_path: Path) -> None:
    from raydiff.train.local import LocalRuntime
    from raydiff.train.loop import run_loop
    from raydiff.train.tasks import task_of_config

    config = apply_overrides(
        ExperimentConfig(),
        [
            *tiny_model(image_size=8),
            "diffusion.diffusion_steps=40",
            "train.batch_size=4",
            "train.max_steps=5",
            "train.eval_interval=3",
            "train.save_interval=100",
            "train.sample_interval=0",
            "scaling.num_workers=1",
        ],
    )
    images = torch.zeros(8, 1, 8, 8)
    runtime = LocalRuntime(
        config, output_dir=tmp_path, resume=None, images=images, labels=None, val=(images, None)
    )

    def make_task(config, *, runtime):
        return FailingEvaluation(task_of_config(config, runtime=runtime))

    with pytest.raises(ValueError, match="the evaluation failed") as caught:
        run_loop(config, runtime=runtime, output_dir=tmp_path, make_task=make_task)
    assert step_of(caught.value) == 3  # the first evaluation's step
    assert "raydiff: raised in training step 3" in caught.value.__notes__


def test_the_driver_says_the_failure_recurred_and_where_the_run_stands(tmp_path: Path) -> None:
    """fit() raised ray.train.ControllerError with the repeat as its controller_failure (a
    stand-in here: no Ray in unit tests)."""
    from raydiff.orchestrate.training_job import run_failed_error

    repeat = RepeatedFailureError(1, LoopFailure(type="builtins.ValueError", message="x", step=6))
    error = run_failed_error(
        SimpleNamespace(controller_failure=repeat), run_dir=tmp_path, max_failures=3
    )
    assert str(error).startswith(
        "training stopped (scaling.max_failures=3): rank 1: ValueError: x recurred at step 6, "
        "where the worker group before failed the same way, so retrying would not help. It "
        "left no complete checkpoint"
    ), str(error)
    assert "raise scaling.max_failures" not in str(error)
