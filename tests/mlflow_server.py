"""A real MLflow tracking server for the tests (``mlflow server``: sqlite backend, one worker),
on a free port of ``host``; stopped with its process group on leaving, also when a test fails.

``served_artifacts``: clients upload artifacts through the server (``mlflow-artifacts:``), as
on a cluster whose nodes share no disk; otherwise they write them to a local folder that every
process of the machine sees.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

START_TIMEOUT_S = 120


@contextlib.contextmanager
def mlflow_server(
    root: Path, *, host: str = "127.0.0.1", served_artifacts: bool = False
) -> Iterator[str]:
    """The server's URI; its database, artifacts and log in ``root``."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        port = probe.getsockname()[1]
    artifacts = (
        ("--artifacts-destination", f"{root}/artifacts")
        if served_artifacts
        else ("--default-artifact-root", f"file:{root}/artifacts")
    )
    log = (root / "server.log").open("w")
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "mlflow", "server", "--workers", "1"),
            *("--host", host, "--port", str(port)),
            *("--backend-store-uri", f"sqlite:///{root}/mlflow.db", *artifacts),
        ],
        env=dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true"),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: stopped whole at the end
    )
    uri = f"http://{host}:{port}"
    try:
        _wait_until_healthy(uri, server, root / "server.log")
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def _wait_until_healthy(uri: str, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"mlflow server did not start: {log.read_text()[-3000:]}")
        time.sleep(0.5)
