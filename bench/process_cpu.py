"""Per-process CPU use over a time window, sampled from ``/proc`` (Linux only).

``bench/train_overhead.py --cpu-breakdown`` uses it to show where the CPU goes while a step is
timed: the training process's share of the cores against everything else (Ray's raylet, GCS,
agents and actor processes). A background thread snapshots every process's ``utime + stime``
every ``interval`` seconds; :meth:`ProcessCpuSampler.shares` turns the snapshots that fall inside
a window into percent of one core per process name (100% = one core busy all the window).
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from pathlib import Path

_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_name(cmdline: list[str]) -> str:
    """A short, stable name: Ray's process title without the method it is running
    (``ray::TrainController`` for ``ray::TrainController.run``; ``ray::IDLE``), a script or a
    binary name."""
    if not cmdline:
        return "?"
    if cmdline[0].startswith("ray::"):
        return cmdline[0].split()[0].split(".")[0]
    scripts = [Path(arg).name for arg in cmdline[1:4] if arg.endswith(".py")]
    if scripts:
        return scripts[0]
    return Path(cmdline[0].split()[0]).name


# The machine-wide busy time (``/proc/stat``) under this key catches what the per-process
# deltas miss: processes that started and exited between two snapshots, and interrupts.
ALL_CPUS = "(all CPUs busy)"


def _busy_ticks() -> int:
    """Ticks all CPUs spent not idle (user, nice, system, irq, softirq, steal)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return user + nice + system + irq + softirq + steal


def _snapshot() -> dict[int, tuple[int, str]]:
    """pid -> (CPU ticks used so far, name) for every readable process; pid -1: all CPUs."""
    processes = {-1: (_busy_ticks(), ALL_CPUS)}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            raw = Path(entry.path, "cmdline").read_bytes()
        except OSError:  # it exited while we looked
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "
        ticks = int(fields[11]) + int(fields[12])  # utime + stime
        cmdline = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
        processes[int(entry.name)] = (ticks, process_name(cmdline) if cmdline else "[kernel]")
    return processes


class ProcessCpuSampler:
    """Snapshots all processes' CPU time every ``interval`` s in a daemon thread."""

    def __init__(self, *, interval: float = 5.0) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        self.interval = interval
        self._snapshots: list[tuple[float, dict[int, tuple[int, str]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="process-cpu", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> ProcessCpuSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while True:
            self._snapshots.append((time.time(), _snapshot()))
            if self._stop.wait(self.interval):
                return

    def cpu_seconds(self, start: float, end: float) -> tuple[float, dict[str, float]] | None:
        """(seconds between the first and last snapshot inside ``[start, end]``, CPU seconds per
        process name in that span); None when fewer than two snapshots fall inside.

        Processes that started and exited between two snapshots are missing from the names but
        not from ``ALL_CPUS``, the machine's total busy time.
        """
        inside = [(t, snap) for t, snap in list(self._snapshots) if start <= t <= end]
        if len(inside) < 2:
            return None
        (t0, first), (t1, last) = inside[0], inside[-1]
        totals: dict[str, float] = defaultdict(float)
        for pid, (ticks, name) in last.items():
            before = first[pid][0] if pid in first else 0  # started inside the window
            used = ticks - before
            if used > 0:
                totals[name] += used / _TICKS_PER_S
        return t1 - t0, dict(sorted(totals.items(), key=lambda item: -item[1]))

    def shares(self, start: float, end: float) -> dict[str, float] | None:
        """Percent of one core per process name between the first and last snapshot inside
        ``[start, end]`` (``time.time()`` values); None when fewer than two fall inside."""
        measured = self.cpu_seconds(start, end)
        if measured is None:
            return None
        span, seconds = measured
        return {name: 100.0 * used / span for name, used in seconds.items()}
