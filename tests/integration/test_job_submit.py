"""``ray job submit ... -- python jobs/train.py`` trains on a ``ray start`` cluster.

The test starts its own head node (``ray start --head`` on free ports, its own temp dir, token auth
off, the venv's ``bin`` first in PATH so that the job's ``python`` is the venv's), submits the
training script with the checkout as the job's working_dir (uploaded without what .gitignore
lists: .venv, data, runs), waits for it, and finds the run's checkpoint.

The cluster is stopped by signalling its own processes, never with ``ray stop``: that kills every
Ray process on the machine, this test session's shared cluster and other users' included.
``ray start`` is run in a new session, so its daemons (GCS, raylet, dashboard, ...) share a process
group that nothing else has; the raylet gives each worker a process group of its own, so the
workers and the job's driver are found as descendants of those daemons.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tiny_model import tiny_model

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent  # ray, and the python the job's entrypoint runs
JOB_TIMEOUT_S = 240  # ~45 s on an idle 2-core machine; far more while other Ray jobs run there

TINY_RUN = [
    *tiny_model(),
    "diffusion.diffusion_steps=50",  # the demo evaluates with ddim50
    "train.batch_size=8",
    "train.max_steps=4",
    "train.log_interval=2",
    "train.save_interval=4",
    # No validation: the job's plumbing is what this test checks, not the metrics.
    "data.val_split=",
    "train.sample_count=4",
    "train.sample_steps=2",
    "scaling.num_workers=1",
    "scaling.cpus_per_worker=0.5",
]


def train_arguments(data: Path, out: Path, *sets: str) -> list[str]:
    """``jobs/train.py --config demo --data DATA --output OUT --set ...`` (after the
    interpreter): the training command of the fault suites, the job submission and the elastic
    tier."""
    return [
        "jobs/train.py",
        "--config",
        "demo",
        "--data",
        str(data),
        "--output",
        str(out),
        *[arg for item in sets for arg in ("--set", item)],
    ]


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free right now (held open together so that none repeats)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def cluster_env() -> dict[str, str]:
    """The environment of ``ray start`` (the raylet's, so every worker's and the job driver's)
    and of ``ray job submit``."""
    # No PYTHONPATH (the integration conftest points it at the checkout): the job must import
    # raydiff from its working_dir. No RAY_ADDRESS: the driver gets the cluster's from the job.
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")}
    env.update(
        PATH=os.pathsep.join([str(VENV_BIN), env.get("PATH", "")]),
        RAY_AUTH_MODE="disabled",  # a throwaway cluster: no token (docs/operations.md)
        RAY_USAGE_STATS_ENABLED="0",
        RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="0.2",  # report() is a barrier of one poll interval
        # One process less to start: nothing preempts a test cluster.
        RAY_TRAIN_ENABLE_PREEMPTION_WATCHER="0",
        # And one actor less (~5 s of CPU here): Ray Train's state tracking only feeds the
        # dashboard's Train page (raydiff switches it on where it is unset).
        RAY_TRAIN_ENABLE_STATE_TRACKING="0",
    )
    return env


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, process group) of ``pid`` from /proc; None when it is gone or a zombie (the
    daemons' parent, ``ray start``, has exited: whoever inherits them may be slow to reap)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else (int(fields[1]), int(fields[2]))


def cluster_processes(pgid: int) -> set[int]:
    """The processes of the cluster ``ray start`` made in process group ``pgid``: that group and
    every descendant of its members (workers and job drivers run in groups of their own)."""
    stats = {int(p): _stat(int(p)) for p in os.listdir("/proc") if p.isdigit()}
    stats = {pid: s for pid, s in stats.items() if s is not None}
    found = {pid for pid, (_, group) in stats.items() if group == pgid}
    while True:
        children = {pid for pid, (parent, _) in stats.items() if parent in found} - found
        if not children:
            return found
        found |= children


def stop_cluster(pgid: int, *, grace_s: float = 3.0) -> None:
    """SIGTERM the cluster's processes, SIGKILL whatever is left after ``grace_s``."""
    processes = cluster_processes(pgid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            processes = {pid for pid in processes if _stat(pid) is not None}
            if not processes:
                return
            time.sleep(0.2)


@dataclass(frozen=True)
class HeadNode:
    address: str  # the dashboard's job API
    temp_dir: Path

    def working_dirs(self) -> list[Path]:
        """The job working_dirs unpacked on this node."""
        resources = self.temp_dir / "session_latest" / "runtime_resources" / "working_dir_files"
        return sorted(p for p in resources.glob("_ray_pkg_*") if p.is_dir())

    def driver_log(self, submission_id: str) -> str:
        """The tail of the job driver's log (what the job printed, and Ray's lines about it)."""
        logs = self.temp_dir / "session_latest" / "logs" / f"job-driver-{submission_id}.log"
        return logs.read_text()[-6000:] if logs.is_file() else f"(no {logs})"


@pytest.fixture
def head_node() -> Iterator[HeadNode]:
    """A ``ray start --head`` cluster of this test, stopped afterwards (its processes only)."""
    gcs, dashboard, client, agent = free_ports(4)
    # Short and fresh: Ray's socket paths live under it (Unix sockets allow ~107 characters).
    temp_dir = Path(tempfile.mkdtemp(prefix="rdjob-", dir="/tmp"))
    command = [
        str(VENV_BIN / "ray"),
        "start",
        "--head",
        f"--port={gcs}",
        f"--dashboard-port={dashboard}",
        # Fixed by default (10001, 52365): another cluster on this machine may hold them.
        f"--ray-client-server-port={client}",
        f"--dashboard-agent-listen-port={agent}",
        "--num-cpus=3",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]
    # A file, not a pipe: the daemons inherit ray start's stdout and outlive it.
    log = temp_dir / "ray-start.log"
    with log.open("w") as log_file:
        # A new session: the daemons share a process group with nothing else (stop_cluster).
        start = subprocess.Popen(
            command, env=cluster_env(), start_new_session=True, stdout=log_file, stderr=log_file
        )
    try:
        start.wait(timeout=60)
        assert start.returncode == 0, log.read_text()
        yield HeadNode(address=f"http://127.0.0.1:{dashboard}", temp_dir=temp_dir)
    finally:
        if start.poll() is None:
            start.kill()
        stop_cluster(start.pid)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_ray_job_submit_runs_jobs_train_py(tiny_dataset, head_node, tmp_path):
    out = tmp_path / "run"
    submission_id = f"raydiff-test-{uuid.uuid4().hex[:8]}"
    submit = [
        str(VENV_BIN / "ray"),
        "job",
        "submit",
        f"--address={head_node.address}",
        f"--submission-id={submission_id}",
        # The checkout as uploaded: .gitignore'd .venv, data/ and runs/ stay behind (and Ray
        # skips .git and .venv by default), so the job imports this raydiff, not an installed one.
        f"--working-dir={REPO}",
        "--",
        "python",
        *train_arguments(tiny_dataset.path, out, *TINY_RUN),
    ]
    console = tmp_path / "submit.log"  # `ray job submit` follows the job's log until it ends
    start = time.monotonic()
    with console.open("w") as console_file:
        client = subprocess.Popen(
            submit,
            env=cluster_env(),
            cwd=tmp_path,  # nothing of the job may depend on the client's folder
            stdout=console_file,
            stderr=subprocess.STDOUT,
        )
    try:
        client.wait(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        client.kill()
        client.wait()
        pytest.fail(
            f"the job did not end within {JOB_TIMEOUT_S} s; driver log:\n"
            + head_node.driver_log(submission_id)
        )
    elapsed = time.monotonic() - start
    output = console.read_text()
    failure = f"{output[-4000:]}\n--- driver log:\n{head_node.driver_log(submission_id)}"
    assert client.returncode == 0, failure
    assert f"Job '{submission_id}' succeeded" in output, failure
    assert "final metrics: step 4" in output, failure
    assert (out / "checkpoint_000004" / "model.pt").is_file(), sorted(p.name for p in out.iterdir())
    # What was uploaded: the checkout without the venv, the datasets and the runs.
    (working_dir,) = head_node.working_dirs()
    assert (working_dir / "jobs" / "train.py").is_file()
    assert (working_dir / "raydiff" / "orchestrate" / "worker.py").is_file()
    assert not {".venv", ".git", "data", "runs"} & {p.name for p in working_dir.iterdir()}
    print(f"ray job submit: {elapsed:.1f} s")
