"""raydiff's Grafana dashboard (raydiff/dashboards/raydiff_training.json) against the gauges
raydiff exports: every gauge of every task is on a panel, and every panel asks for the runs the
``run`` variable selects. That each panel's query returns a real run's data from a real
Prometheus is tests/integration/test_dashboard_prometheus.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

from raydiff.dashboards import TRAINING_DASHBOARD
from raydiff.orchestrate.metrics import metric_names
from raydiff.train.tasks import task_specs

REPO = Path(__file__).resolve().parents[2]
RUN_FILTER = 'run=~"$run"'


def dashboard() -> dict[str, Any]:
    return json.loads(TRAINING_DASHBOARD.read_text())


def queries() -> dict[str, str]:
    """{panel title: its PromQL}; a panel has one query."""
    found = {}
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            continue
        (target,) = panel["targets"]
        found[panel["title"]] = target["expr"]
    return found


def charted(name: str, expr: str) -> bool:
    """Whether ``expr`` selects the metric ``name`` (``ray_raydiff_...``): by name, or by a
    ``__name__`` regex (PromQL's regexes match the whole name)."""
    if re.search(rf"\b{name}\{{", expr):
        return True
    return any(re.fullmatch(regex, name) for regex in re.findall(r'__name__=~"([^"]+)"', expr))


def test_every_exported_gauge_of_every_task_is_on_a_panel() -> None:
    exprs = queries().values()
    for spec in task_specs().values():
        for name in metric_names(spec):
            exported = f"ray_{name}"  # Ray's namespace in front
            assert any(charted(exported, expr) for expr in exprs), (spec.name, exported)


def test_the_check_of_charted_gauges_can_fail() -> None:
    assert not charted("ray_raydiff_val_bpd", 'ray_raydiff_val_bpd_x{run=~"$run"}')
    assert not charted("ray_raydiff_vbx", '{__name__=~"ray_raydiff_(loss|vb)"}')
    assert charted("ray_raydiff_vb", '{__name__=~"ray_raydiff_(loss|vb)"}')


def test_every_panel_selects_the_runs_of_the_run_variable() -> None:
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    run = variables["run"]
    assert run["query"]["query"] == "label_values(ray_raydiff_step, run)"
    assert run["multi"] and run["includeAll"] and run["allValue"] == ".*"
    for title, expr in queries().items():
        assert expr.count(RUN_FILTER) == 1, (title, expr)
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    assert all(p["datasource"] == "${datasource}" for p in panels if p["type"] != "row")


def test_the_dashboard_ships_in_the_package() -> None:
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["raydiff"]
    assert "dashboards/*.json" in package_data
    printed = subprocess.run(
        [sys.executable, "-m", "raydiff.dashboards"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout.strip()
    assert Path(printed) == TRAINING_DASHBOARD and TRAINING_DASHBOARD.is_file()
