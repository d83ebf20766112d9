"""A Ray run whose --output is an S3 URI: moto's S3 server on 127.0.0.1, the AWS environment a
user would set (keys, region, AWS_ENDPOINT_URL), two workers on the shared cluster.

The environment is set in this test's process only, after the shared ``ray_cluster`` fixture
started Ray: its workers never see it. That is the point: the driver builds the S3 filesystem
from its environment (raydiff.storage, keys included) and that object travels to Ray Train's
controller, the workers and the loss-history actor, so a cluster started without the variables
(a remote one, or this one) writes to the same bucket.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_training import GLOBAL_BATCH, run, tiny_config

pytestmark = pytest.mark.integration

BUCKET = "raydiff-test"
AWS_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_PROFILE",
)


@pytest.fixture
def s3_bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An empty bucket on a moto S3 server of this test, and the AWS variables pointing at it."""
    import boto3
    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    for name in AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    boto3.client("s3").create_bucket(Bucket=BUCKET)  # boto3 reads the same variables
    try:
        yield BUCKET
    finally:
        server.stop()


def bucket_keys(bucket: str) -> set[str]:
    import boto3

    pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return {item["Key"] for page in pages for item in page.get("Contents", [])}


def test_a_run_on_s3_keeps_everything_there_and_resumes_from_it(
    ray_cluster, tiny_dataset, s3_bucket, tmp_path
):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from raydiff.storage import as_location, download
    from raydiff.train.checkpoint import load_checkpoint

    uri = f"s3://{s3_bucket}/runs/r1"
    overrides = {"train.save_interval": 4, "train.sample_interval": 2}
    first = run(tiny_config(tiny_dataset.path, **{"train.max_steps": 4, **overrides}), uri)
    assert first["step"] == 4
    assert first["checkpoint"] == f"{uri}/checkpoint_000004"
    assert first["output_dir"] == uri

    keys = bucket_keys(s3_bucket)
    run_keys = {k.removeprefix("runs/r1/") for k in keys if k.startswith("runs/r1/")}
    assert {
        "config.json",
        "checkpoint_000004/files.json",
        "checkpoint_000004/model.pt",
        "checkpoint_000004/trainer.pt",
        "checkpoint_000004/progress.json",
        "samples/samples_000002.png",
        "samples/samples_000004.png",
    } <= run_keys, sorted(run_keys)
    assert any(k.startswith("tensorboard/events.out.tfevents.") for k in run_keys), run_keys
    assert not Path("s3:").exists()  # nothing went to a local folder named after the URI

    # A user's view: download the events and read them.
    events_dir = download(as_location(uri) / "tensorboard", tmp_path / "tb1")
    events = EventAccumulator(str(events_dir), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [2, 4]

    # The same command with more steps continues from the checkpoint in the bucket.
    second = run(tiny_config(tiny_dataset.path, **{"train.max_steps": 6, **overrides}), uri)
    assert second["step"] == 6
    assert second["checkpoint"] == f"{uri}/checkpoint_000006"
    final_dir = download(as_location(second["checkpoint"]), tmp_path / "checkpoint_000006")
    final = load_checkpoint(final_dir)
    assert final["trainer"]["step"] == 6
    # Every step's losses are in the loss history: checkpoint 4's went on (the actor loaded it).
    assert int(final["trainer"]["sampler"]["loss_counts"].sum()) == 6 * GLOBAL_BATCH

    events_dir = download(as_location(uri) / "tensorboard", tmp_path / "tb2")
    events = EventAccumulator(str(events_dir), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [2, 4, 6]
    assert sorted(e.step for e in events.Scalars("train/loss_step")) == [1, 2, 3, 4, 5, 6]
    # The second run trained steps 5 and 6 only: it resumed, it did not start from step 0.
    files = sorted(events_dir.glob("events.out.tfevents.*"), key=lambda f: f.name.split(".")[3])
    assert len(files) == 2
    second_events = EventAccumulator(str(files[-1]), size_guidance={"scalars": 0})
    second_events.Reload()
    assert [e.step for e in second_events.Scalars("train/loss_step")] == [5, 6]
    assert "runs/r1/samples/samples_000006.png" in bucket_keys(s3_bucket)
