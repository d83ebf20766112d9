"""Which failures of a run a restart cannot help: the same error at the same step again (a bug,
a collapse: each retry from the checkpoint fails the same way; docs/training.md,
"Failures and resuming"). The loop notes on every exception it raises the step it was at
(:func:`note_step`, an exception note: it survives the pickling that brings the error to Ray
Train's controller), and :class:`FailureHistory` there compares each attempt's failures with
the attempt before's. An error without the note (a lost worker or node, a preemption) is never
a repeat. No Ray here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from raydiff.errors import first_line

STEP_NOTE = "raydiff: raised in training step "
"""The note's text before the step number (step 0: while the loop was being built)."""


def note_step(error: BaseException, *, step: int) -> None:
    """Note on ``error`` that the loop raised it in ``step`` (once: the innermost note stays)."""
    if step_of(error) is None:
        error.add_note(f"{STEP_NOTE}{step}")


def step_of(error: BaseException) -> int | None:
    """The step :func:`note_step` noted on ``error``; None for an error the loop did not raise."""
    for note in getattr(error, "__notes__", ()):
        if isinstance(note, str) and note.startswith(STEP_NOTE):
            return int(note.removeprefix(STEP_NOTE))
    return None


@dataclasses.dataclass(frozen=True)
class LoopFailure:
    """One rank's error as the loop raised it: what (type and message) and where (step)."""

    type: str  # qualified: "builtins.ValueError"
    message: str
    step: int

    @classmethod
    def of(cls, error: BaseException) -> LoopFailure | None:
        """``error`` as a :class:`LoopFailure`; None when the loop did not raise it."""
        step = step_of(error)
        if step is None:
            return None
        kind = type(error)
        return cls(type=f"{kind.__module__}.{kind.__qualname__}", message=str(error), step=step)

    def describe(self) -> str:
        """``ValueError: message`` in one line (the type's own name, as a traceback's last line
        has it; the message as :func:`raydiff.errors.first_line` quotes one)."""
        name = self.type.rpartition(".")[2]
        line = first_line(self.message)
        return f"{name}: {line}" if line else name


class RepeatedFailureError(RuntimeError):
    """A worker group failed with the same error at the same step as the one before it: a
    restart from the same checkpoint would fail again."""

    def __init__(self, rank: int, failure: LoopFailure) -> None:
        self.rank, self.failure = rank, failure
        where = f"step {failure.step}" if failure.step else "the start, before the first step"
        super().__init__(
            f"rank {rank}: {failure.describe()} recurred at {where}, where the worker group "
            "before failed the same way, so retrying would not help"
        )

    def __reduce__(self) -> tuple[object, tuple[int, LoopFailure]]:
        # Two arguments, one message: the default (cls(*args)) would rebuild from the message.
        return type(self), (self.rank, self.failure)


class FailureHistory:
    """The failures of a run's worker groups, one after another: :meth:`repeat` of each group's
    failure says whether it is the one before's again."""

    def __init__(self) -> None:
        self.previous: frozenset[LoopFailure] = frozenset()

    def repeat(self, errors: Mapping[int, BaseException]) -> RepeatedFailureError | None:
        """The error to stop the run with when ``errors`` (world rank -> what it raised) hold a
        failure of the group before (same type, message and step), else None.

        A group with an error the loop did not raise (a worker or node lost: the other ranks'
        errors are then its collateral) is never a repeat and is not remembered; the next
        group is compared with the last one that failed by itself. Of the ranks' failures one
        in common is enough: which ranks fail alongside it (a collective cut short) may vary.
        """
        failures = {rank: LoopFailure.of(error) for rank, error in errors.items()}
        if not failures or None in failures.values():
            return None
        repeated = [(rank, f) for rank, f in sorted(failures.items()) if f in self.previous]
        self.previous = frozenset(f for f in failures.values() if f is not None)
        return RepeatedFailureError(*repeated[0]) if repeated else None
