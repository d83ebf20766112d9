"""``raydiff family`` on the shared local cluster: a tiny family (an 8x8 base model, its noisy
classifier, an 8 -> 16 upsampler and a 16x16 evaluator, each a few steps) end to end; the same
family stopped mid-way and continued without retraining what finished; a stage that fails while
the stages that do not need it finish."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import TinyDataset
from tiny_model import tiny_classifier, tiny_model

from raydiff.cli import main
from raydiff.cli.exit_codes import EXIT_RUN_FAILED

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


def checkpoint_times(out: Path) -> dict[str, float]:
    """Each stage's final checkpoint's modification time (a retrained stage writes it again)."""
    return {
        stage: (out / stage / f"checkpoint_{STEPS:06d}" / "model.pt").stat().st_mtime
        for stage in ("base", "classifier", "upsampler", "evaluator")
    }


def test_a_tiny_family_trains_samples_and_judges(
    ray_cluster: None, tiny_dataset: TinyDataset, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "family"
    assert main(["family", str(tiny_family(tmp_path, tiny_dataset)), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert list(report["models"]) == ["base", "classifier", "upsampler", "evaluator"]
    assert all(m["step"] == STEPS for m in report["models"].values())
    rows = {row["name"]: row for row in report["samples"]}
    assert list(rows) == ["family", "unguided", "base_alone"]
    for row in rows.values():
        assert row["num_samples"] == 8 and 0 <= row["fd"] < float("inf")
    # Guided samples carry the classes they were guided to: the evaluator's accuracy on them.
    assert 0 <= rows["family"]["accuracy"] <= 1 and rows["unguided"]["accuracy"] is None
    assert "| family | base model + classifier guidance (scale 1) + upsampler |" in printed
    assert (out / "report.png").read_bytes()[:4] == b"\x89PNG"
    for stage in ("base", "classifier", "upsampler", "evaluator"):
        assert (out / "logs" / f"{stage}.log").is_file()
    assert len(list((out / "sample" / "guided" / "upsampled").glob("samples_8x16x16x1.npz"))) == 1
    # Again: every stage is finished, nothing is trained or sampled again.
    before = checkpoint_times(out)
    samples = next((out / "sample" / "guided" / "upsampled").glob("*.npz")).stat().st_mtime
    assert main(["family", str(tiny_family(tmp_path, tiny_dataset)), "--output", str(out)]) == 0
    assert checkpoint_times(out) == before
    assert next((out / "sample" / "guided" / "upsampled").glob("*.npz")).stat().st_mtime == samples
