"""``raydiff ema --evaluate``: a post-hoc EMA sweep of a tiny diffusion model on the shared local
cluster, FD measured in a tiny clean classifier's features; a classifier's and an upsampler's.
Each sweep runs once: that a seed gives the same samples (and so the same numbers) whatever the
batches and workers is tests/unit/test_sample_generate.py's and test_sampling.py's."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from conftest import TinyDataset
from tiny_model import tiny_classifier, tiny_model

from raydiff.cli import main
from raydiff.config import ExperimentConfig, apply_overrides
from raydiff.train.local import run_single_process

pytestmark = pytest.mark.integration

STEPS = 24


def train(out: Path, overrides: list[str], dataset: Path) -> Path:
    """``overrides`` trained ``STEPS`` steps in this process; its last checkpoint."""
    config = apply_overrides(
        ExperimentConfig(),
        [
            *overrides,
            f"data.data_dir={dataset}",
            "train.batch_size=16",
            f"train.max_steps={STEPS}",
            f"train.save_interval={STEPS}",
            "train.sample_interval=0",
            "train.eval_interval=0",
            "optim.lr=1e-3",
        ],
    )
    run_single_process(config, output_dir=out)
    return out / f"checkpoint_{STEPS:06d}"


@pytest.fixture(scope="module")
def runs(tiny_dataset: TinyDataset, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A diffusion run tracking two post-hoc EMA lengths (a snapshot every 2 steps) and a fixed
    EMA of 0.9, and a clean classifier of the same data as the evaluator."""
    root = tmp_path_factory.mktemp("ema_sweep")
    diffusion = [
        *tiny_model(),
        "diffusion.diffusion_steps=20",
        "diffusion.noise_schedule=cosine",
        "optim.ema_rate=0.9",
        "optim.posthoc_ema_stds=0.05,0.10",
        "optim.posthoc_ema_interval=2",
    ]
    evaluator = [*tiny_classifier(), "classifier.noised=false"]
    train(root / "diffusion", diffusion, tiny_dataset.path)
    return root / "diffusion", train(root / "evaluator", evaluator, tiny_dataset.path)


def sweep(run: Path, evaluator: Path, out: Path, capsys: pytest.CaptureFixture) -> str:
    code = main(
        [
            "ema",
            "--run",
            str(run),
            "--sigma-rel",
            "0.06:0.10:3",
            "--evaluate",
            "--features",
            str(evaluator),
            "--num-samples",
            "8",
            "--num-images",
            "8",
            "--num-workers",
            "1",
            "--timestep-respacing",
            "ddim5",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    return printed


def test_a_sweep_ranks_every_length_and_the_fixed_ema(
    ray_cluster: None, runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run, evaluator = runs
    printed = sweep(run, evaluator, tmp_path / "sweep", capsys)
    with open(tmp_path / "sweep" / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    names = [r["weights"] for r in rows]
    assert names == ["phema_0.060", "phema_0.080", "phema_0.100", "ema_0.9"]
    for row in rows:
        for key in ("fd_classifier", "precision_classifier", "recall_classifier", "val_bpd"):
            assert float(row[key]) == pytest.approx(float(row[key]))  # finite, not NaN
            assert abs(float(row[key])) < float("inf")
    assert rows[-1]["reconstruction_error"] == "" and rows[-1]["rate"] == "0.9"
    assert all(float(r["reconstruction_error"]) < 1e-2 for r in rows[:-1])
    [best] = [r for r in rows if r["best"] == "1"]
    assert best["fd_classifier"] == min((r["fd_classifier"] for r in rows), key=float)
    assert f"best: {best['weights']}" in printed
    assert (tmp_path / "sweep" / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_classifier_sweep_ranks_by_its_validation_accuracy(
    ray_cluster: None, tiny_dataset: TinyDataset, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A noisy classifier tracking post-hoc EMA: each length's own validation on the val split,
    the best the highest val_acc@1 (its spec's first objective), no samples drawn."""
    classifier = [
        *tiny_classifier(),
        "optim.posthoc_ema_stds=0.05,0.10",
        "optim.posthoc_ema_interval=2",
    ]
    run = train(tmp_path / "classifier", classifier, tiny_dataset.path).parent
    out = tmp_path / "sweep"
    argv = ["ema", "--run", str(run), "--sigma-rel", "0.06:0.10:3", "--evaluate"]
    assert main([*argv, "--num-images", "16", "--num-workers", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    with open(out / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["weights"] for r in rows] == ["phema_0.060", "phema_0.080", "phema_0.100"]
    accuracies = [float(r["val_acc@1"]) for r in rows]
    assert all(0 <= a <= 1 for a in accuracies)
    [best] = [r for r in rows if r["best"] == "1"]
    assert float(best["val_acc@1"]) == max(accuracies)
    assert f"best: {best['weights']}" in printed
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_upsampler_sweep_upsamples_the_val_images(
    ray_cluster: None,
    runs: tuple[Path, Path],
    tiny_dataset: TinyDataset,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    """An upsampler (4x4 -> 16x16) tracking post-hoc EMA: every length upsamples the same
    shrunk val images, whose FD against the val split (in the evaluator's features) ranks it."""
    _, evaluator = runs
    upsampler = [
        *tiny_model(),
        "train.task=super_res",
        "super_res.small_size=4",
        "diffusion.diffusion_steps=20",
        "diffusion.noise_schedule=cosine",
        "optim.posthoc_ema_stds=0.05,0.10",
        "optim.posthoc_ema_interval=2",
    ]
    run = train(tmp_path / "upsampler", upsampler, tiny_dataset.path).parent
    out = tmp_path / "sweep"
    argv = ["ema", "--run", str(run), "--sigma-rel", "0.06,0.09", "--evaluate"]
    evaluation = ["--features", str(evaluator), "--num-samples", "8", "--num-images", "8"]
    speed = ["--num-workers", "1", "--timestep-respacing", "ddim5", "--bpd-respacing", "10"]
    assert main([*argv, *evaluation, *speed, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    [low_res] = (out / "low_res").iterdir()
    assert low_res.name == "samples_8x4x4x1.npz"
    with open(out / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["weights"] for r in rows] == ["phema_0.060", "phema_0.090", "ema_0.9999"]
    for row in rows:
        assert 0 <= float(row["fd_classifier"]) < float("inf")
        assert 0 < float(row["val_bpd"]) < float("inf")
    [best] = [r for r in rows if r["best"] == "1"]
    assert best["fd_classifier"] == min((r["fd_classifier"] for r in rows), key=float)
    assert f"best: {best['weights']}" in printed
    for row in rows:  # the samples upsampled the shrunk val images
        [samples] = (out / row["weights"] / "samples").glob("samples_*.npz")
        assert samples.name == "samples_8x16x16x1.npz"
