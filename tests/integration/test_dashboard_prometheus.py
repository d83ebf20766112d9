"""Every panel of raydiff's Grafana dashboard shows a real run, read from a real Prometheus server.

A ``prometheus`` binary (the Debian package ``prometheus``, which scripts/setup.sh installs) runs
as a subprocess on a temporary storage folder and a free port, with a 1 s scrape interval over
the targets of the shared cluster's own service-discovery file: the
``prom_metrics_service_discovery.json`` that Ray's dashboard writes into the session folder and
keeps up to date (the session folder is found through ``ray.nodes()``, whose socket paths lie in
it). Once Prometheus scrapes this node's metrics export port, a short 2-worker run of the tiny
model trains; then each panel's PromQL, its ``$run`` replaced by the run's name, goes to
Prometheus' HTTP API (``/api/v1/query``) until every panel returns series of that run.

Without the binary the test skips, unless under CI, where the ``prometheus`` marker makes the
skip an error (tests/conftest.py).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_training import run, tiny_config

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


@pytest.fixture
def prometheus(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A Prometheus server scraping the targets of Ray's service-discovery file every second;
    yields its base URL once it scrapes this node's metrics port."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip(
            "the prometheus binary is not installed (Debian package prometheus: "
            "apt-get install prometheus, as scripts/setup.sh does)"
        )
    request.getfixturevalue("ray_cluster")  # after the check: a skip starts no cluster
    session, target = node_export_target()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: ray\n"
        f"    file_sd_configs: [{{files: ['{service_discovery_file(session, target)}']}}]\n"
    )
    url = f"http://127.0.0.1:{free_port()}"
    log = tmp_path / "prometheus.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
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


def query(url: str, expr: str) -> list[dict[str, Any]]:
    """The series of an instant query, [] while there are none."""
    answer = get_json(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
    assert answer is not None and answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


def test_every_dashboard_panel_returns_the_run_from_prometheus(
    prometheus: str, tiny_dataset, tmp_path: Path
):
    out = tmp_path / f"charts-{uuid.uuid4().hex[:8]}"
    config = tiny_config(
        tiny_dataset.path,
        # Validation at both reports: the values a worker sets last reach the node's endpoint
        # only as it exits, and the panels do not rest on that.
        **{"train.max_steps": 4, "train.eval_interval": 2, "data.val_split": "val"},
    )
    assert run(config, out)["step"] == 4
    targets = {p["title"]: p["targets"] for p in panels()}
    assert all(len(t) == 1 for t in targets.values()), "one query per panel"
    exprs = {title: t[0]["expr"].replace("$run", out.name) for title, t in targets.items()}
    # Each panel's first answer with data: a finished run's gauges leave the node's endpoint
    # (and so Prometheus' instant queries) some 20 s after its processes exit.
    seen: dict[str, list[dict[str, Any]]] = {}
    deadline = time.monotonic() + WAIT_S
    while len(seen) < len(exprs) and time.monotonic() < deadline:
        for title in exprs.keys() - seen.keys():
            if series := query(prometheus, exprs[title]):
                seen[title] = series
        time.sleep(0.5)
    empty = ", ".join(sorted(exprs.keys() - seen.keys()))
    assert not empty, f"panels without data for run {out.name}: {empty}"
    for title, series in seen.items():
        assert {s["metric"]["run"] for s in series} == {out.name}, (title, series)

    def value(title: str) -> float:
        (series,) = seen[title]
        return float(series["value"][1])

    assert value("Step") in (2, 4)  # the first answer: step 4's values may come as rank 0 exits
    assert (value("Workers"), value("Failures"), value("Preemptions")) == (2, 0, 0)
