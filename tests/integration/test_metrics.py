"""A Ray run's training metrics reach the node's Prometheus endpoint (the dashboard's Metrics view).

One short one-worker run on the shared cluster, then the local node's metrics export port is
scraped until raydiff's gauges for this run appear (Ray's metrics agent exports every few
seconds; a gauge keeps its value after the worker exits).
"""

from __future__ import annotations

import re
import time
import urllib.request
import uuid
from pathlib import Path

from raydiff.config import ExperimentConfig, apply_overrides

SCRAPE_TIMEOUT_S = 30.0


def config(data_dir: Path) -> ExperimentConfig:
    return apply_overrides(
        ExperimentConfig(),
        [
            "model.image_size=16",
            "model.in_channels=1",
            "model.num_channels=32",
            "model.channel_mult=1,2",
            "model.num_res_blocks=1",
            "model.attention_resolutions=",
            "diffusion.diffusion_steps=20",
            "diffusion.noise_schedule=cosine",
            "optim.ema_rate=0.9",
            "train.batch_size=8",
            "train.max_steps=4",
            "train.log_interval=2",
            "train.save_interval=4",
            "train.eval_interval=4",
            "train.eval_num_images=8",
            "train.eval_timesteps=2",
            "train.sample_interval=0",
            "train.sample_count=4",
            "train.sample_steps=2",
            "train.schedule_sampler=loss-second-moment",
            "scaling.num_workers=1",
            "scaling.cpus_per_worker=0.5",
            "scaling.sampler_refresh_interval=2",
            f"data.data_dir={data_dir}",
        ],
    )


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


def test_training_metrics_are_exported_to_prometheus_with_the_run_tag(
    ray_cluster, tiny_dataset, tmp_path
):
    from raydiff.orchestrate.metrics import metric_names
    from raydiff.orchestrate.trainer import run_training_job

    run = f"metrics-{uuid.uuid4().hex[:8]}"  # this run's tag only, whatever ran before
    result = run_training_job(config(tiny_dataset.path), output_dir=tmp_path / run)
    assert result["step"] == 4

    expected = {f"ray_{name}" for name in metric_names()} - {"ray_raydiff_vb"}  # no learned sigma
    found = scrape(metrics_url(), run, expected)
    assert expected <= set(found), sorted(expected - set(found))
    assert found["ray_raydiff_step"] == 4
    assert found["ray_raydiff_loss"] == result["loss"]
    assert found["ray_raydiff_val_bpd"] == result["val_bpd"] > 0
    assert found["ray_raydiff_images_per_second"] > 0
    assert found["ray_raydiff_learning_rate"] == result["lr"]
    assert found["ray_raydiff_skipped_steps"] == 0
    assert found["ray_raydiff_loss_scale"] == result["loss_scale"]
    assert 0 < found["ray_raydiff_sampler_entropy"] <= 1
    assert found["ray_raydiff_sampler_weight_min"] <= 1 <= found["ray_raydiff_sampler_weight_max"]
