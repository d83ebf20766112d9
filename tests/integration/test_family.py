"""``raydiff family`` on the shared local cluster: a tiny family (an 8x8 base model, its noisy
classifier, an 8 -> 16 upsampler and a 16x16 evaluator, each a few steps) written to the
session's S3 server, stopped mid-way and continued from the bucket without retraining what
finished, then sampled and judged there. (A stage that fails while
the stages that do not need it finish: tests/unit/test_family_stages.py, the scheduler with
stand-in commands; a training refusing to continue another model's run:
tests/unit/test_run_checks.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from conftest import TinyDataset
from s3_server import S3Server
from tiny_model import tiny_classifier, tiny_model

from raydiff.cli import main
from raydiff.storage import StoragePath, as_location
from raydiff.train.checkpoint import latest_checkpoint

pytestmark = pytest.mark.integration

STEPS = 6


def as_mapping(overrides: list[str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in overrides)


def tiny_family(tmp_path: Path, dataset: TinyDataset, *, steps: int = STEPS) -> Path:
    """The family file: the tiny dataset at 16x16, and prepared again at 8x8 for the base model
    and its classifier; one half-CPU worker per training, so four fit beside Ray Data."""
    small = str(tmp_path / "data8")
    common = {
        "batch_size": 8,
        "max_steps": steps,
        "save_interval": steps,
        "eval_interval": steps,
        "eval_num_images": 8,
        "sample_interval": 0,
        "log_interval": 2,
        "lr": 1e-3,
    }
    diffusion = {"diffusion_steps": 20, "noise_schedule": "cosine", "ema_rate": "0.9"}
    resources = {"num_workers": 1, "cpus_per_worker": 0.5}
    blocks = {
        "datasets": {
            small: {"source": str(dataset.path.parent / "tiny.npz"), "image_size": 8,
                    "channels": 1, "val_count": 32, "progress": False, "num_workers": 1},
        },
        "base": {
            "config": "demo",
            "set": {**as_mapping(tiny_model(image_size=8)), **common, **diffusion,
                    "data_dir": small},
            "resources": resources,
        },
        "classifier": {
            "config": "classifier_demo",
            "set": {**as_mapping(tiny_classifier(image_size=8)), **common,
                    "diffusion_steps": 20, "noise_schedule": "cosine", "data_dir": small},
            "resources": resources,
        },
        "upsampler": {
            "config": "upsampler_demo",
            "set": {**as_mapping(tiny_model(image_size=16)), **common, **diffusion,
                    "small_size": 8, "data_dir": str(dataset.path)},
            "resources": resources,
        },
        "evaluator": {
            "config": "evaluator_demo",
            "set": {**as_mapping(tiny_classifier(image_size=16)), **common,
                    "noised": False, "data_dir": str(dataset.path)},
            "resources": resources,
        },
        "sample": {"num_samples": 8, "timestep_respacing": "ddim4",
                   "upsampler_respacing": "ddim4", "num_workers": 2, "batch_size": 8},
        "evaluate": {"split": "val"},
    }  # fmt: skip
    path = tmp_path / "family.yaml"
    path.write_text(yaml.safe_dump(blocks))
    return path


def checkpoint_times(
    server: S3Server, bucket: str, prefix: str, stages: tuple[str, ...]
) -> dict[str, datetime]:
    """Each stage's final checkpoint's time in the bucket (a retrained stage writes it again)."""
    client = server.client()
    return {
        stage: client.head_object(
            Bucket=bucket, Key=f"{prefix}/{stage}/checkpoint_{STEPS:06d}/model.pt"
        )["LastModified"]
        for stage in stages
    }


def wait_for(condition, *, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {seconds} s"
        time.sleep(0.2)


SHORT = ("base", "classifier", "evaluator")


def test_a_family_stopped_mid_way_continues_and_is_judged(
    ray_cluster: None,
    tiny_dataset: TinyDataset,
    s3_server: S3Server,
    s3_bucket: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    """In a bucket: SIGTERM once three stages finished and the upsampler (longer) is on its
    way; the same command again retrains none of the three, continues the upsampler and its
    log, samples and reports, all in the bucket (the family's AWS variables reach every
    stage's process; Ray's workers have none)."""
    import ray

    family = tiny_family(tmp_path, tiny_dataset)
    prefix = f"families/{uuid.uuid4().hex[:8]}"
    out: StoragePath = as_location(f"s3://{s3_bucket}/{prefix}")
    # The upsampler long enough to be stopped mid-way; continued for 10 more steps.
    longer = ["--set", "upsampler.max_steps=5000", "--set", "upsampler.save_interval=10"]
    argv = ["family", str(family), "--output", str(out)]
    address = ray.get_runtime_context().gcs_address
    process = subprocess.Popen(
        [sys.executable, "-m", "raydiff.cli", *argv, *longer, "--address", address],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
    reader.start()
    try:
        wait_for(
            lambda: all(any(f"{s}: finished" in line for line in lines) for s in SHORT),
            seconds=300,
            what="finished short stages",
        )
        wait_for(
            lambda: latest_checkpoint(out / "upsampler") is not None,
            seconds=120,
            what="upsampler checkpoint",
        )
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=150)
        reader.join(timeout=10)
    finally:
        process.kill()
    printed = "".join(lines)
    assert process.returncode == 143, printed
    assert "stopped by SIGTERM; stopped the stages upsampler" in printed
    assert not (out / "sample").exists()
    log = (out / "logs" / "upsampler.log").read_text()  # uploaded when it was stopped
    assert log.startswith("$ raydiff train --config upsampler_demo"), log
    before = checkpoint_times(s3_server, s3_bucket, prefix, SHORT)
    stopped_at = int(latest_checkpoint(out / "upsampler").name.split("_")[-1])
    assert 10 <= stopped_at < 5000
    again = [
        "--set",
        f"upsampler.max_steps={stopped_at + 10}",
        "--set",
        "upsampler.save_interval=10",
    ]
    assert main([*argv, *again, "--address", address]) == 0
    assert checkpoint_times(s3_server, s3_bucket, prefix, SHORT) == before  # not retrained
    log = (out / "logs" / "upsampler.log").read_text()
    assert "continuing from" in log
    assert log.count("$ raydiff train --config upsampler_demo") == 2  # the rerun's appended
    printed = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert list(report["models"]) == ["base", "classifier", "upsampler", "evaluator"]
    steps = {name: model["step"] for name, model in report["models"].items()}
    assert steps == {
        "base": STEPS,
        "classifier": STEPS,
        "upsampler": stopped_at + 10,
        "evaluator": STEPS,
    }
    rows = {row["name"]: row for row in report["samples"]}
    assert list(rows) == ["family", "unguided", "base_alone"]
    for row in rows.values():
        assert row["num_samples"] == 8 and 0 <= row["fd"] < float("inf")
    # Guided samples carry the classes they were guided to: the evaluator's accuracy on them.
    assert 0 <= rows["family"]["accuracy"] <= 1 and rows["unguided"]["accuracy"] is None
    assert "| family | base model + classifier guidance (scale 1) + upsampler |" in printed
    assert (out / "report.png").read_bytes()[:4] == b"\x89PNG"
    # Folder markers (keys ending in "/", as pyarrow's create_dir leaves them) aside.
    found = s3_server.keys(s3_bucket, f"{prefix}/")
    keys = {k.removeprefix(f"{prefix}/") for k in found if not k.endswith("/")}
    assert {
        *(f"logs/{stage}.log" for stage in (*SHORT, "upsampler", "sample")),
        *(f"report.{kind}" for kind in ("md", "json", "csv", "png")),
        "sample/guided/upsampled/samples_8x16x16x1.npz",
        "sample/unguided/base/sampling.json",
        "evaluate/family/fd_classifier.json",
        "evaluate/base_alone/bicubic/samples_8x16x16x1.npz",
    } <= keys, sorted(keys)
    assert {key.partition("/")[0] for key in keys} == {
        *SHORT, "upsampler", "sample", "evaluate", "logs", "report.md", "report.json",
        "report.csv", "report.png",
    }  # fmt: skip
    assert not Path("s3:").exists()  # nothing went to a local folder named after the URI
