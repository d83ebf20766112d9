"""One training driver per run folder: an exclusive lock held for the whole run (two drivers in
one folder would mix their checkpoints, events and samples). No Ray here.

The lock is ``fcntl.flock`` on ``RUN/.run.lock``, not the file's existence: the kernel releases
it when the holder ends, however it ends, so a dead driver never leaves a stale lock. The file's
JSON only describes the last holder. Locks are per open file (a second ``run_lock`` in the same
process is refused too); on NFS (v4) Linux makes ``flock`` a byte-range lock across clients.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from raydiff.errors import UserInputError
from raydiff.storage import StoragePath, local_path

LOCK_FILE = ".run.lock"


class RunFolderInUseError(UserInputError):
    """Another driver is training into this run folder right now."""


@contextlib.contextmanager
def run_lock(location: str | os.PathLike[str] | StoragePath) -> Iterator[Path | None]:
    """Hold the run folder's lock while the block runs (creating the folder); yields the lock
    file. Raises :class:`RunFolderInUseError` at once when another driver holds it. A URI's
    folder has no lock (object stores have none: one driver per remote run folder is the user's
    to ensure); the block runs and gets None."""
    run_dir = local_path(location)
    if run_dir is None:
        yield None
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFolderInUseError(_in_use_message(run_dir, _holder(fd))) from None
        os.ftruncate(fd, 0)
        holder = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "command": " ".join(sys.argv),
        }
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        try:
            yield path
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


HOLDER_WAIT_S = 2.0
"""How long a refused driver waits for the holder's description: the holder writes it right
after it takes the lock, so two drivers started at once can find the lock taken and the file
still empty."""


def _holder(fd: int) -> dict[str, object]:
    """What the holder wrote, waiting up to :data:`HOLDER_WAIT_S` while the file is empty
    (empty after that, or when unreadable)."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while not (text := os.pread(fd, 64 * 1024, 0)) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        holder = json.loads(text or b"{}")
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _in_use_message(run_dir: Path, holder: dict[str, object]) -> str:
    who, stop = "holder unknown", "stop it"
    if holder:
        pid, host = holder.get("pid", "?"), holder.get("host", "?")
        who = f"pid {pid} on {host}, started {holder.get('started', '?')}: {holder.get('command')}"
        stop = f"stop it (Ctrl-C in its console, or kill {pid} on {host})"
    return (
        f"the run folder {run_dir} is in use by another training run ({who}); two drivers in "
        f"one folder would mix their checkpoints. Wait for that run to end or {stop}, then run "
        "this command again to continue it; or give a new --output folder"
    )
