"""Stop a run whose restarted worker group fails the same way as the one before it.

Ray Train's controller calls a ``ray.train.UserCallback``'s ``after_exception`` with the
workers' errors whenever it finds some, before it decides on a restart; this callback keeps a
:class:`raydiff.train.failure.FailureHistory` of them in the controller (one instance lives
there for the whole ``fit()``, across restarts) and raises
:class:`raydiff.train.failure.RepeatedFailureError` when a group's failure repeats the last one.

Why raising ends the run: Ray 2.60 offers no public failure policy (``FailureConfig`` counts
failures, it does not tell them apart) and an error raised by the workers always comes back as
a ``WorkerGroupError``, which the controller retries until ``max_failures`` is spent. An error
raised in a callback the controller runs is a controller error instead, and a controller error
other than a failed worker group start is never retried: ``fit()`` raises
``ray.train.ControllerError`` whose ``controller_failure`` is this callback's error, the workers
are stopped and the run's checkpoints stay as they are (``raydiff.orchestrate.training_job``
turns it into the run's one-line error). tests/integration/test_repeated_failure.py pins that
behaviour, so a Ray release that changes it fails there.
"""

from __future__ import annotations

from typing import Any

import ray.train

from raydiff.train.failure import FailureHistory


class StopRepeatedFailure(ray.train.UserCallback):
    """Ends the run (through the controller) when a worker group fails as the one before did."""

    def __init__(self) -> None:
        self.history = FailureHistory()

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        repeated = self.history.repeat(worker_exceptions)
        if repeated is not None:
            raise repeated
