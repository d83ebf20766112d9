"""The tier rules of tests/conftest.py: under CI a tier cannot pass by skipping.

Each case runs pytest on a small copy of the layout (the real conftest, a unit and an e2e test
file) in a subprocess, with and without ``CI`` set.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

UNIT = """
import pytest

def test_runs():
    pass

def test_skips():
    pytest.skip("not here")
"""

E2E = """
import pytest

@pytest.mark.skipif(True, reason="the dataset is not installed")
def test_needs_the_dataset():
    pass
"""

DATASET = """
import pytest

pytestmark = pytest.mark.dataset

def test_learns_on_the_dataset():
    pytest.skip("no Fashion-MNIST here")
"""

PROMETHEUS = """
import pytest

pytestmark = pytest.mark.prometheus

@pytest.fixture
def server():
    pytest.skip("no prometheus binary here")

def test_reads_prometheus(server):
    pass
"""


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiers")
    (root / "tests" / "unit").mkdir(parents=True)
    (root / "tests" / "e2e").mkdir()
    shutil.copy(TESTS / "conftest.py", root / "tests" / "conftest.py")
    (root / "tests" / "unit" / "test_a.py").write_text(UNIT)
    (root / "tests" / "e2e" / "test_b.py").write_text(E2E)
    (root / "tests" / "unit" / "test_c.py").write_text(DATASET)
    (root / "tests" / "unit" / "test_d.py").write_text(PROMETHEUS)
    (root / "pytest.ini").write_text(
        "[pytest]\naddopts = -p no:cacheprovider\n"
        "markers =\n    unit\n    integration\n    slow\n    gpu\n    dataset\n    prometheus\n"
    )
    return root


def run(layout: Path, *args: str, ci: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *args],
        cwd=layout,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_locally_a_skipped_e2e_tier_passes(layout: Path) -> None:
    assert run(layout, "-m", "slow", ci=None).returncode == 0
    assert run(layout, "-m", "slow", ci="false").returncode == 0


def test_under_ci_a_skip_in_the_e2e_tier_fails_and_says_why(layout: Path) -> None:
    done = run(layout, "-m", "slow", ci="true")
    assert done.returncode == 1, done.stdout
    assert "skipped under CI (the dataset is not installed)" in done.stdout


def test_under_ci_other_tiers_may_skip_some_tests_but_not_all(layout: Path) -> None:
    assert run(layout, "-m", "unit", "-k", "not dataset and not prometheus", ci="1").returncode == 0
    done = run(layout, "-m", "unit", "-k", "skips", ci="1")
    assert done.returncode == 1, done.stdout
    assert "all 1 selected tests skipped" in done.stdout


def test_under_ci_a_skipped_test_that_needs_the_dataset_fails_in_any_tier(layout: Path) -> None:
    assert run(layout, "-m", "unit", "-k", "dataset", ci=None).returncode == 0
    done = run(layout, "-m", "unit", "-k", "dataset", ci="1")
    assert done.returncode == 1, done.stdout
    assert "skipped under CI (no Fashion-MNIST here)" in done.stdout


def test_under_ci_a_test_that_needs_prometheus_fails_when_its_fixture_skips(layout: Path) -> None:
    assert run(layout, "-m", "unit", "-k", "prometheus", ci=None).returncode == 0
    done = run(layout, "-m", "unit", "-k", "prometheus", ci="1")
    assert done.returncode == 1, done.stdout
    assert "skipped under CI (no prometheus binary here)" in done.stdout


def test_under_ci_the_rules_hold_with_the_unit_tiers_parallel_workers(layout: Path) -> None:
    """`make test` runs the unit tier with pytest-xdist: its controller sees every report."""
    assert (
        run(
            layout, "-m", "unit", "-k", "not dataset and not prometheus", "-n", "2", ci="1"
        ).returncode
        == 0
    )
    done = run(layout, "-m", "unit", "-k", "skips", "-n", "2", ci="1")
    assert done.returncode == 1 and "all 1 selected tests skipped" in done.stdout, done.stdout
    done = run(layout, "-m", "unit", "-k", "dataset", "-n", "2", ci="1")
    assert done.returncode == 1, done.stdout
    assert "skipped under CI (no Fashion-MNIST here)" in done.stdout


def test_under_ci_a_tier_over_its_budget_fails_naming_itself_and_its_slowest_tests(
    layout: Path, tmp_path: Path
) -> None:
    """The same layout with the unit tier's budget set to 0 s: under CI that tier fails (with
    pytest-xdist's workers too); locally it passes."""
    over = tmp_path / "over"
    shutil.copytree(layout, over)
    with (over / "tests" / "conftest.py").open("a") as conftest:
        conftest.write('\nTIER_BUDGETS_S["unit"] = 0\n')
    selected = ("-k", "runs")
    assert run(over, "-m", "unit", *selected, ci=None).returncode == 0
    for workers in ((), ("-n", "2")):
        done = run(over, "-m", "unit", *selected, *workers, ci="1")
        assert done.returncode == 1, done.stdout
        assert "CI: the unit tier took " in done.stdout and "over its budget of 0 s" in done.stdout
        assert "s  tests/unit/" + "test_a.py::test_runs" in done.stdout, done.stdout
