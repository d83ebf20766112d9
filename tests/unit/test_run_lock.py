"""The run folder's lock: one driver at a time, never a stale lock after a dead one."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raydiff.errors import UserInputError
from raydiff.train.run_lock import LOCK_FILE, RunFolderInUseError, run_lock

HOLD = """
import sys, time
from raydiff.train.run_lock import run_lock
with run_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def _hold_in_subprocess(run_dir: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_the_lock_creates_the_folder_and_is_released_after_the_block(tmp_path):
    run_dir = tmp_path / "new" / "run"
    with run_lock(run_dir) as path:
        assert path == run_dir / LOCK_FILE and path.is_file()
    with run_lock(run_dir):  # released: taken again
        pass
    with pytest.raises(RuntimeError), run_lock(run_dir):
        raise RuntimeError("the run failed")
    with run_lock(run_dir):  # released on an exception too
        pass


def test_a_uri_has_no_lock_and_its_block_runs():
    """Object stores have no locks: one driver per remote run folder is the user's to ensure.
    Nothing is created or reached (the name alone says it is a URI)."""
    with run_lock("s3://bucket/runs/r1") as path, run_lock("s3://bucket/runs/r1") as again:
        assert path is None and again is None


def test_a_second_holder_in_the_same_process_is_refused(tmp_path):
    with run_lock(tmp_path), pytest.raises(RunFolderInUseError) as refused, run_lock(tmp_path):
        pass
    message = str(refused.value)
    assert isinstance(refused.value, UserInputError)
    assert str(tmp_path) in message and f"pid {os.getpid()}" in message, message
    assert socket.gethostname() in message and "--output" in message, message


def test_another_process_is_refused_until_the_holder_dies_even_by_sigkill(tmp_path):
    holder = _hold_in_subprocess(tmp_path)
    try:
        start = time.monotonic()
        with pytest.raises(RunFolderInUseError) as refused, run_lock(tmp_path):
            pass
        assert time.monotonic() - start < 1.0  # refused at once, not after waiting
        assert f"pid {holder.pid} on {socket.gethostname()}" in str(refused.value)
        assert f"kill {holder.pid}" in str(refused.value)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with run_lock(tmp_path):  # the kernel dropped the dead process's lock: nothing stale
        assert (tmp_path / LOCK_FILE).is_file()


def test_an_unreadable_holder_description_still_gives_a_clear_refusal(tmp_path):
    with run_lock(tmp_path) as path:
        path.write_text("not json")
        with pytest.raises(RunFolderInUseError, match="holder unknown"), run_lock(tmp_path):
            pass


def test_a_driver_started_at_the_same_time_waits_for_the_holders_description(tmp_path):
    """Two drivers at once: the loser can find the lock taken and its file still empty (the
    winner writes who it is just after locking); it waits briefly and names the holder."""
    import fcntl
    import json
    import os
    import threading

    path = tmp_path / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # locked, nothing written yet
        description = json.dumps({"pid": 4242, "host": "h", "started": "s", "command": "c"})
        writer = threading.Timer(0.3, lambda: os.pwrite(fd, description.encode(), 0))
        writer.start()
        with pytest.raises(RunFolderInUseError, match=r"pid 4242 on h"), run_lock(tmp_path):
            pass
        writer.join()
    finally:
        os.close(fd)
