"""SIGTERM to a training driver stops the run as Ctrl-C does (Ray Train's SIGINT path), and the
command exits 143 with the same message naming SIGTERM. The Ctrl-C path itself, on a real
cluster, is tests/integration/test_faults.py's."""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import pytest

from raydiff.errors import RunInterruptedError


def test_sigterm_while_training_becomes_sigint_then_the_handler_is_put_back():
    from raydiff.orchestrate.driver_signals import sigterm_as_ctrl_c

    before = signal.getsignal(signal.SIGTERM)
    before_sigint = signal.getsignal(signal.SIGINT)
    # No Ray Train here: Python's own SIGINT handler turns the raised SIGINT into
    # KeyboardInterrupt where Ray Train's would abort the run.
    with pytest.raises(KeyboardInterrupt), sigterm_as_ctrl_c() as stopped:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)  # the handler runs at once; the sleep only bounds a miss
    assert stopped.sigterm and (stopped.name, stopped.described) == ("SIGTERM", "SIGTERM")
    assert signal.getsignal(signal.SIGTERM) == (before if before is not None else signal.SIG_DFL)
    # fit() installs a SIGINT handler of its own and leaves it: the block's end puts it back.
    with sigterm_as_ctrl_c() as stopped:
        signal.signal(signal.SIGINT, lambda signum, frame: None)
    assert signal.getsignal(signal.SIGINT) is before_sigint


def test_a_run_stopped_by_sigterm_exits_143_and_by_ctrl_c_130(monkeypatch, capsys):
    from raydiff.cli import app

    for name, code in (("SIGTERM", 143), ("SIGINT", 130)):

        def stopped(args, name=name):
            raise RunInterruptedError(f"stopped by {name}; where it stands", signal_name=name)

        train = dataclasses.replace(app.SUBCOMMANDS["train"], run=stopped)
        monkeypatch.setitem(app.SUBCOMMANDS, "train", train)
        assert app.main(["train", "--config", "demo"]) == code
        assert f"raydiff train: stopped by {name}; where it stands" in capsys.readouterr().err


def test_any_command_stopped_by_ctrl_c_or_sigterm_says_so_and_exits_130_or_143(monkeypatch, capsys):
    """A command stopped where it has nothing more to say (before it joins Ray, or one without
    Ray) gets one line instead of a traceback; SIGTERM takes Ctrl-C's path."""
    from raydiff.cli import app

    def ctrl_c(args):
        raise KeyboardInterrupt

    def sigterm(args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs at once; the sleep only bounds a miss
        raise AssertionError("SIGTERM did not stop the command")

    before = signal.getsignal(signal.SIGTERM)
    for run, code, how in ((ctrl_c, 130, "Ctrl-C (SIGINT)"), (sigterm, 143, "SIGTERM")):
        evaluate = dataclasses.replace(app.SUBCOMMANDS["evaluate"], run=run)
        monkeypatch.setitem(app.SUBCOMMANDS, "evaluate", evaluate)
        assert app.main(["evaluate", "fid", "--samples", "x.npz"]) == code
        assert capsys.readouterr().err.strip() == f"raydiff evaluate: stopped by {how}"
    assert signal.getsignal(signal.SIGTERM) == (before if before is not None else signal.SIG_DFL)
