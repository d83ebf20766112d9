"""Test tiers by directory: tests/unit -> unit, tests/integration -> integration, tests/e2e -> slow.

Select a tier with ``-m unit`` / ``-m integration`` / ``-m slow``; ``-m "not slow"`` is the CI set.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_TIERS = {"unit": "unit", "integration": "integration", "e2e": "slow"}

# Integration tests that run Ray clusters of their own (several nodes, `ray start`) go first:
# before the shared local cluster starts, whose idle processes would otherwise take CPU from
# their clusters for the whole of their run (minutes, on a 2-core machine).
_OWN_CLUSTERS = ("test_faults.py", "test_job_submit.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for folder, marker in _TIERS.items():
            if folder in parts:
                item.add_marker(getattr(pytest.mark, marker))
    items.sort(key=lambda item: Path(str(item.fspath)).name not in _OWN_CLUSTERS)  # stable
