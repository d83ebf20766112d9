"""How a driver stops on SIGTERM: the way it stops on Ctrl-C.

A pod being stopped, a scheduler's cancel or ``kill`` sends SIGTERM. Ray installs its own
handler for it at ``ray.init``, which prints a C++ stack trace and aborts the process; Ray Train
and Ray Tune both stop gracefully on SIGINT instead (Train aborts the workers, Tune saves its
state for a resume), and plain Python code raises KeyboardInterrupt, which runs its ``finally``
blocks. So ``raydiff`` turns one into the other around each command (:func:`raydiff.cli.app.main`)
and again, after ``ray.init``, around what a driver waits on in Ray: Train's and Tune's
``fit()`` and the model actors' batches (sampling, the bound).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class StopSignal:
    """Which signal stopped the block of :func:`sigterm_as_ctrl_c`, once it has (SIGTERM arrives
    as Ctrl-C, so a KeyboardInterrupt alone does not say)."""

    sigterm: bool = False

    @property
    def name(self) -> str:
        """``"SIGTERM"`` or ``"SIGINT"`` (``RunInterruptedError.signal_name``)."""
        return "SIGTERM" if self.sigterm else "SIGINT"

    @property
    def described(self) -> str:
        """For messages: ``"SIGTERM"`` or ``"Ctrl-C (SIGINT)"``."""
        return "SIGTERM" if self.sigterm else "Ctrl-C (SIGINT)"


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[StopSignal]:
    """While the block runs, SIGTERM to this process raises SIGINT (Ctrl-C) instead (why: the
    module docstring); the yielded :class:`StopSignal` records a SIGTERM, for the driver to say
    which signal stopped it. Off the main thread (a sweep trial's driver) signals are left alone.

    Afterwards both handlers are put back: SIGTERM's previous Python handler, or the default
    where the previous one was Ray's C++ handler (``signal.getsignal`` gives None for it), and
    SIGINT's, because Ray Train's ``fit()`` leaves its own installed when it returns (a later
    Ctrl-C would ask the finished run's controller to abort and exit with status 0)."""

    stopped = StopSignal()

    def stop(signum: int, frame: object) -> None:
        stopped.sigterm = True
        signal.raise_signal(signal.SIGINT)

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread
        yield stopped
        return
    previous_sigint = signal.getsignal(signal.SIGINT)
    try:
        yield stopped
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        if previous_sigint is not None:
            signal.signal(signal.SIGINT, previous_sigint)
