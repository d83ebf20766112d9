"""Every panel of raydiff's Grafana dashboard shows a real run, read from a real Prometheus server.

A ``prometheus`` binary (the Debian package ``prometheus``, which scripts/setup.sh installs) runs
as a subprocess on a temporary storage folder and a free port, with a 1 s scrape interval over
the targets of the shared cluster's own service-discovery file: the
``prom_metrics_service_discovery.json`` that Ray's dashboard writes into the session folder and
keeps up to date (the session folder is found through ``ray.nodes()``, whose socket paths lie in
it). It runs only while the session's shared 2-worker run (conftest.py's ``two_worker_run``)
trains: started once it scrapes this node's metrics export port, stopped once every panel's
PromQL, its ``$run`` replaced by the run's name, has returned that run's series from Prometheus'
range-query API (``/api/v1/query_range``, from the run's start) up to its last step
(:func:`dashboard_series`). A range, not an instant query: a finished run's gauges leave the
node's endpoint (and so instant queries) some 20 s after its processes exit. A server that
scraped the whole session would cost its CPU to every other test.

Without the binary the test skips, unless under CI, where the ``prometheus`` marker makes the
skip an error (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raydiff.dashboards import TRAINING_DASHBOARD

pytestmark = pytest.mark.prometheus  # under CI its skip is an error (tests/conftest.py)

SERVICE_DISCOVERY = "prom_metrics_service_discovery.json"
WAIT_S = 45.0


def node_export_target() -> tuple[Path, str]:
    """This cluster's session folder and this node's metrics target (``IP:MetricsExportPort``),
    from ``ray.nodes()``: the raylet's socket lies in ``SESSION/sockets/``."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    (node,) = [n for n in ray.nodes() if n["NodeID"] == node_id]
    session = Path(node["RayletSocketName"]).parents[1]
    return session, f"{node['NodeManagerAddress']}:{node['MetricsExportPort']}"


def wait_for(what: str, check: Any, *, timeout: float = WAIT_S) -> Any:
    """``check()``'s first truthy value, polled every 0.5 s; fails naming ``what`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"no {what} after {timeout:.0f} s")


def service_discovery_file(session: Path, target: str) -> Path:
    """Ray's service-discovery file of this session, once it lists ``target``."""
    path = session / SERVICE_DISCOVERY

    def lists_target() -> bool:
        try:
            groups = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or mid-write
            return False
        return any(target in group["targets"] for group in groups)

    wait_for(f"{target} in {path}", lists_target)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.load(response)
    except OSError:  # not listening yet
        return None


@contextlib.contextmanager
def start_prometheus(folder: Path) -> Iterator[str | None]:
    """A Prometheus server (its files in ``folder``) scraping the targets of Ray's
    service-discovery file every second; yields its base URL once it scrapes this node's metrics
    port, or None where the binary is not installed. Stopped on leaving the block."""
    binary = shutil.which("prometheus")
    if binary is None:
        yield None
        return
    session, target = node_export_target()
    config = folder / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: ray\n"
        f"    file_sd_configs: [{{files: ['{service_discovery_file(session, target)}']}}]\n"
    )
    url = f"http://127.0.0.1:{free_port()}"
    log = folder / "prometheus.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address={url.removeprefix('http://')}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(f"Prometheus scraping {target} (log: {log})", lambda: scrapes(url, target))
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def scrapes(url: str, target: str) -> bool:
    """Whether Prometheus at ``url`` has scraped ``target`` successfully."""
    targets = get_json(f"{url}/api/v1/targets")
    active = (targets or {}).get("data", {}).get("activeTargets", [])
    return any(t["labels"]["instance"] == target and t["health"] == "up" for t in active)


def panels() -> list[dict[str, Any]]:
    """The dashboard's chart panels (rows left out)."""
    dashboard = json.loads(TRAINING_DASHBOARD.read_text())
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def query(url: str, expr: str, *, start: float) -> list[dict[str, Any]]:
    """The series of a range query from ``start`` to now, one point a second ([] while there
    are none); each series' ``values`` are its [time, value] points."""
    parameters = {"query": expr, "start": start, "end": time.time(), "step": 1}
    answer = get_json(f"{url}/api/v1/query_range?{urllib.parse.urlencode(parameters)}")
    assert answer is not None and answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


def last(series: list[dict[str, Any]]) -> float:
    """The newest value of a panel's one series."""
    (only,) = series
    return float(only["values"][-1][1])


def dashboard_series(url: str, run: str, *, start: float, step: int) -> dict[str, list]:
    """{panel title: its series} of the run named ``run``, from ``start``: polled until every
    panel has data and the Step panel reached ``step`` (the last step's values are on the
    node's endpoint when the run returns; Prometheus scrapes them within a second or two)."""
    targets = {p["title"]: p["targets"] for p in panels()}
    assert all(len(t) == 1 for t in targets.values()), "one query per panel"
    exprs = {title: t[0]["expr"].replace("$run", run) for title, t in targets.items()}
    seen: dict[str, list[dict[str, Any]]] = {}
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        seen = {
            title: series
            for title, expr in exprs.items()
            if (series := query(url, expr, start=start))
        }
        if len(seen) == len(exprs) and last(seen["Step"]) == step:
            break
        time.sleep(0.5)
    return {title: seen.get(title, []) for title in exprs}


def test_every_dashboard_panel_returns_the_run_from_prometheus(two_worker_run):
    if two_worker_run.panels is None:
        pytest.skip(
            "the prometheus binary is not installed (Debian package prometheus: "
            "apt-get install prometheus, as scripts/setup.sh does)"
        )
    run, seen = two_worker_run.out.name, two_worker_run.panels
    empty = ", ".join(sorted(title for title, series in seen.items() if not series))
    assert not empty, f"panels without data for run {run}: {empty}"
    for title, series in seen.items():
        assert {s["metric"]["run"] for s in series} == {run}, (title, series)
    assert last(seen["Step"]) == 8
    assert (last(seen["Workers"]), last(seen["Failures"]), last(seen["Preemptions"])) == (2, 0, 0)
