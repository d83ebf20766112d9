"""A Ray run's training metrics reach the node's Prometheus endpoint (the dashboard's Metrics view).

The session's short 2-worker run (the ``two_worker_run`` fixture, shared with test_training.py);
right after it the local node's metrics export port is scraped (:func:`run_metrics`) until
raydiff's gauges for that run appear. Ray's metrics agent exports every few seconds; a finished
run's gauges stay for a while after its workers exit, not for the rest of the session. Rank 0
alone exports: the figures are reduced over the workers.
"""

from __future__ import annotations

import re
import time
import urllib.request

SCRAPE_TIMEOUT_S = 30.0


def metrics_url() -> str:
    """This node's Prometheus endpoint: the metrics agent's export port, from ``ray.nodes()``."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    (node,) = [n for n in ray.nodes() if n["NodeID"] == node_id]
    return f"http://127.0.0.1:{node['MetricsExportPort']}/metrics"


def scrape(url: str, run: str, names: set[str]) -> dict[str, float]:
    """{metric name: value} of the ``ray_raydiff_*`` samples tagged ``run=run``, polled until
    every one of ``names`` is there (or the timeout)."""
    sample = re.compile(r"^(ray_raydiff_\w+)\{([^}]*)\} (\S+)$")
    tag = f'run="{run}"'
    found: dict[str, float] = {}
    deadline = time.monotonic() + SCRAPE_TIMEOUT_S
    while time.monotonic() < deadline:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        for line in text.splitlines():
            match = sample.match(line)
            if match and tag in match.group(2).split(","):
                found[match.group(1)] = float(match.group(3))
        if names <= set(found):
            break
        time.sleep(1.0)
    return found


def expected_metrics() -> set[str]:
    from raydiff.orchestrate.metrics import metric_names
    from raydiff.train.tasks import task_spec

    # A diffusion run without learned sigma: no vb.
    return {f"ray_{name}" for name in metric_names(task_spec("diffusion"))} - {"ray_raydiff_vb"}


def run_metrics(run: str) -> dict[str, float]:
    """raydiff's gauges of the run named ``run`` (its tag) on this node's endpoint."""
    return scrape(metrics_url(), run, expected_metrics())


def test_training_metrics_are_exported_to_prometheus_with_the_run_tag(two_worker_run):
    result, found = two_worker_run.result, two_worker_run.metrics
    assert result["step"] == 8
    expected = expected_metrics()
    assert expected <= set(found), sorted(expected - set(found))
    assert found["ray_raydiff_step"] == 8
    assert found["ray_raydiff_workers"] == 2
    assert found["ray_raydiff_loss"] == result["loss"]
    assert found["ray_raydiff_val_bpd"] == result["val_bpd"] > 0
    assert found["ray_raydiff_images_per_second"] > 0
    assert found["ray_raydiff_learning_rate"] == result["lr"]
    assert found["ray_raydiff_skipped_steps"] == 0
    assert found["ray_raydiff_loss_scale"] == result["loss_scale"]
    assert 0 < found["ray_raydiff_sampler_entropy"] <= 1
    assert found["ray_raydiff_sampler_weight_min"] <= 1 <= found["ray_raydiff_sampler_weight_max"]
