"""Which Ray cluster a run uses: the one it is given (--address, RAY_ADDRESS), else its own; and
the workers of a local instance look up that same cluster.

For the decision ``ray.init`` is replaced by a recorder: what is checked is the decision, not
Ray's connection code. The last test runs on the shared local instance.
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


def test_the_workers_of_a_local_instance_run_the_setup_hook(ray_cluster):
    """``start_local_ray`` gives its workers raydiff's setup hook (the job's runtime_env): it pins
    their cluster lookups to this instance (``pin_ray_address``)."""
    import os

    import ray

    @ray.remote(num_cpus=0)
    def cluster_address() -> str | None:
        return os.environ.get("RAY_ADDRESS")

    assert ray.get(cluster_address.remote()) == ray.get_runtime_context().gcs_address
