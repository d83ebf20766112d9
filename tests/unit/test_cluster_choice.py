"""Which Ray cluster a run uses: the one it is given (--address, RAY_ADDRESS), else its own.

``ray.init`` is replaced by a recorder: what is checked is raydiff's decision, not Ray's
connection code (the workers of a local instance are checked on a real one in
tests/integration/test_ray_address.py).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest


@pytest.fixture
def ray_init_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    import ray

    calls: list[dict[str, Any]] = []

    def record(**kwargs: Any) -> None:
        calls.append(kwargs)

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", record)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return calls


def test_an_address_given_is_joined_without_local_resources(ray_init_calls, monkeypatch):
    from raydiff.orchestrate.ray_session import ensure_ray

    ensure_ray(address="auto", num_workers=2, cpus_per_worker=1.0)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # what `ray job submit` sets
    ensure_ray(address=None, num_workers=2, cpus_per_worker=1.0)
    assert [call["address"] for call in ray_init_calls] == ["auto", "10.0.0.1:6379"]
    assert all("num_cpus" not in call for call in ray_init_calls)  # Ray refuses those when joining


def test_without_an_address_a_local_instance_with_spare_cpus_starts(ray_init_calls, monkeypatch):
    from raydiff.orchestrate import ray_session

    started: list[dict[str, Any]] = []
    context = SimpleNamespace(dashboard_url="", address_info={"session_dir": "/tmp/ray/x"})
    monkeypatch.setattr(ray_session, "start_local_ray", lambda **kw: started.append(kw) or context)
    ray_session.ensure_ray(address=None, num_workers=4, cpus_per_worker=1.0)
    assert ray_init_calls == [] and started[0]["num_cpus"] >= 4 + 2  # room for Ray Data
