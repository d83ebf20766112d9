"""Test tiers by directory: tests/unit -> unit, tests/integration -> integration, tests/e2e -> slow.

Select a tier with ``-m unit`` / ``-m integration`` / ``-m slow``; ``-m "not slow"`` is the CI set.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_TIERS = {"unit": "unit", "integration": "integration", "e2e": "slow"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for folder, marker in _TIERS.items():
            if folder in parts:
                item.add_marker(getattr(pytest.mark, marker))
