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
