"""Test tiers by directory: tests/unit -> unit, tests/learning -> learning (models that must learn
on the real dataset, in one process: no Ray), tests/integration -> integration, tests/cluster ->
cluster (Ray nodes that share no disk, each in network and mount namespaces of its own: root
only), tests/e2e -> slow, tests/gpu -> gpu.

Select a tier with ``-m unit`` / ``-m learning`` / ``-m integration`` / ``-m cluster`` / ``-m slow`` / ``-m gpu`` /
``-m elastic``
(tests/integration/test_elastic.py: elastic and preemptible training on a multi-node cluster). The gpu tier is
skipped on a machine without CUDA.

Under CI (the ``CI`` environment variable set, as ``.ci/run`` does), a tier must not pass
without running: a skipped test of the slow tier, or one marked ``dataset`` or ``prometheus`` in
another tier, is an error (its skip reasons are "the dataset is not installed" or "the prometheus
binary is not installed", which CI must fix, not hide), and a run whose every selected test
skipped fails.
Locally skipping stays allowed.

Under CI each tier of ``make test`` also has a wall-time budget (``TIER_BUDGETS_S``, from pytest's
start to its end, selected with ``-m TIER``): a tier over its budget fails, naming itself and its
slowest tests, so that CI stays under 12 minutes and growth is a decision (docs/testing.md).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import ClassVar

import pytest

_TIERS = {
    "unit": "unit",
    "learning": "learning",
    "integration": "integration",
    "cluster": "cluster",
    "e2e": "slow",
    "gpu": "gpu",
}
# Modules of a directory's tier that form a tier of their own (minutes long: not in make test).
_OWN_TIERS = {"test_elastic.py": "elastic"}

# Integration tests that run Ray clusters of their own (several nodes, `ray start`) go first:
# before the shared local cluster starts, whose idle processes would otherwise take CPU from
# their clusters for the whole of their run (minutes, on a 2-core machine).
_OWN_CLUSTERS = ("test_faults.py", "test_job_submit.py")
# Markers whose skips are errors under CI: what set-up installs (scripts/setup.sh) must be there.
_REQUIRED_UNDER_CI = ("slow", "cluster", "dataset", "prometheus")
# Each tier's wall time under CI, in seconds: 30-50% over its time on a fresh clone of the 2-core
# Intel Xeon (docs/testing.md: the same tests vary by 20-30% from day to day there). The goal is
# 12 minutes in all, set-up included; the integration tier is not there yet, so these budgets
# hold the suite where it is: growth is a decision, and a cut lowers the budget with it.
TIER_BUDGETS_S = {"unit": 110, "learning": 110, "integration": 1400, "cluster": 300, "slow": 280}
# How many of an over-budget tier's slowest tests its failure names.
_SLOWEST_NAMED = 10


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for folder, marker in _TIERS.items():
            if folder in parts:
                marker = _OWN_TIERS.get(parts[-1], marker)
                item.add_marker(getattr(pytest.mark, marker))
    items.sort(key=lambda item: Path(str(item.fspath)).name not in _OWN_CLUSTERS)  # stable
    if any(item.get_closest_marker("gpu") for item in items) and not _has_cuda():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def under_ci() -> bool:
    """True when the ``CI`` environment variable says so (any value but empty, 0, false, no)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    report = yield
    if (
        report.skipped
        and not hasattr(report, "wasxfail")
        and any(item.get_closest_marker(marker) for marker in _REQUIRED_UNDER_CI)
        and under_ci()
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = (
            f"skipped under CI ({reason}): the slow tier and the tests that need the dataset "
            "or the prometheus binary must run in CI, so a skip there is an error (unset CI to "
            "allow it locally)"
        )
    return report


class _Outcomes:
    """Counts of the tests that ran and the ones that skipped, for the CI rule above; when the
    session started, and each test's time (setup, call and teardown), for the tier budgets."""

    ran = 0
    skipped = 0
    started = 0.0
    seconds: ClassVar[dict[str, float]] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    _Outcomes.started = time.monotonic()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and not report.skipped:
        _Outcomes.ran += 1
    elif report.skipped and not hasattr(report, "wasxfail"):
        _Outcomes.skipped += 1
    _Outcomes.seconds[report.nodeid] = _Outcomes.seconds.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return  # a pytest-xdist worker: the controller sees every report and decides
    if not under_ci():
        return
    write = session.config.get_terminal_writer().line
    if _Outcomes.skipped and not _Outcomes.ran and exitstatus == 0:
        write(
            f"CI: all {_Outcomes.skipped} selected tests skipped; a tier that runs nothing fails "
            "under CI (unset CI to allow it locally)",
            red=True,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    over = _over_budget(session.config.getoption("markexpr"))
    if over:
        write(over, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _over_budget(tier: str) -> str:
    """The failure of a tier (``-m TIER``) that took longer than its budget; '' within it."""
    budget = TIER_BUDGETS_S.get(tier)
    took = time.monotonic() - _Outcomes.started
    if budget is None or took <= budget:
        return ""
    slowest = sorted(_Outcomes.seconds.items(), key=lambda item: -item[1])[:_SLOWEST_NAMED]
    named = "".join(f"\n  {seconds:6.1f} s  {nodeid}" for nodeid, seconds in slowest)
    return (
        f"CI: the {tier} tier took {took:.0f} s, over its budget of {budget} s "
        f"(TIER_BUDGETS_S in tests/conftest.py, docs/testing.md): make it faster, or raise its "
        f"budget knowing that CI must stay under 12 minutes. Its slowest tests:{named}"
    )
