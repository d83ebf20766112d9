"""The workers of a local instance look up that same cluster (on the shared local instance;
the choice of cluster itself is checked with ``ray.init`` recorded, in the unit tier)."""

from __future__ import annotations


def test_the_workers_of_a_local_instance_run_the_setup_hook(ray_cluster):
    """``start_local_ray`` gives its workers raydiff's setup hook (the job's runtime_env): it pins
    their cluster lookups to this instance (``pin_ray_address``)."""
    import os

    import ray

    @ray.remote(num_cpus=0)
    def cluster_address() -> str | None:
        return os.environ.get("RAY_ADDRESS")

    assert ray.get(cluster_address.remote()) == ray.get_runtime_context().gcs_address


def test_a_minimum_the_cluster_cannot_hold_is_said_at_start(ray_cluster, caplog):
    """The shared instance has 4 CPUs: 2 workers of 1 CPU fit, a minimum of 6 does not, and the
    run says what it waits for instead of waiting silently."""
    import logging

    from raydiff.orchestrate.ray_session import report_capacity

    caplog.set_level(logging.WARNING, logger="raydiff")
    assert report_capacity(min_workers=2, cpus_per_worker=1.0, use_gpu=False)
    assert not caplog.records
    assert not report_capacity(min_workers=6, cpus_per_worker=1.0, use_gpu=False)
    assert not report_capacity(min_workers=1, cpus_per_worker=1.0, use_gpu=True)
    first, second = (record.getMessage() for record in caplog.records)
    assert (
        "waiting for 6 workers' resources (1 CPU each); the cluster has 4 CPU (room for 4)" in first
    )
    assert "waiting for 1 workers' resources (1 GPU each); the cluster has 0 GPU" in second
