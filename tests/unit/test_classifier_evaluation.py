"""Sample quality measured with a raydiff classifier: ``raydiff evaluate accuracy`` and
``raydiff evaluate fid --features`` (Fréchet distance in a clean classifier's features)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_evaluate_fid_cli import run_with_checkpoint
from tiny_model import tiny_classifier

from raydiff.config import ExperimentConfig, apply_overrides, to_dict
from raydiff.errors import ConfigError, UserInputError
from raydiff.evaluate.accuracy import run_accuracy
from raydiff.evaluate.classifier_features import load_classifier_features
from raydiff.evaluate.options import FidOptions
from raydiff.evaluate.samples_fid import run_fid
from raydiff.factory import create_classifier
from raydiff.train.checkpoint import save_checkpoint

pytestmark = pytest.mark.unit


def classifier_checkpoint(root: Path, *, noised: bool) -> Path:
    config = apply_overrides(
        ExperimentConfig(),
        [*tiny_classifier(image_size=16), f"classifier.noised={str(noised).lower()}"],
    )
    torch.manual_seed(0)
    network = create_classifier(config)
    with torch.no_grad():  # the attention head's projection starts at zero
        for param in network.parameters():
            if not param.any():
                param.normal_(std=0.5)
    return save_checkpoint(
        root,
        5,
        model_state=network.state_dict(),
        ema_states={},
        trainer_state={"step": 5},
        config=to_dict(config),
    )


def images(seed: int, count: int = 40) -> np.ndarray:
    """Smooth blobs (not noise): a stand-in for a dataset."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:16, :16]
    centres = rng.uniform(4, 12, (count, 2))
    blobs = np.exp(-((yy - centres[:, :1, None]) ** 2 + (xx - centres[:, 1:, None]) ** 2) / 8)
    return (blobs * 255).astype(np.uint8)[..., None]


@pytest.fixture
def evaluator(tmp_path: Path) -> Path:
    return classifier_checkpoint(tmp_path / "evaluator", noised=False)


def test_accuracy_is_the_evaluators_hit_rate_on_the_labels(tmp_path, evaluator):
    pictures = images(0)
    features = load_classifier_features(evaluator)
    with torch.no_grad():
        predicted = features.predict(
            torch.from_numpy(pictures).permute(0, 3, 1, 2).repeat(1, 3, 1, 1)
        ).numpy()
    labels = predicted.copy()
    labels[:10] = (labels[:10] + 1) % 10  # a quarter wrong
    np.savez(tmp_path / "samples_40x16x16x1.npz", pictures, labels)
    # Drawn by a run's checkpoint with DDIM on 25 steps: the figure reaches that run's
    # TensorBoard under the sampler's own tag.
    run, checkpoint = run_with_checkpoint(tmp_path, tmp_path / "data")
    record = {"checkpoint": str(checkpoint), "timestep_respacing": "ddim25", "use_ddim": True}
    (tmp_path / "sampling.json").write_text(json.dumps(record))
    result = run_accuracy(samples=str(tmp_path), classifier=str(evaluator))
    assert result.summary["accuracy"] == pytest.approx(0.75)
    assert json.loads(Path(result.json_path).read_text())["num_images"] == 40
    assert Path(result.json_path) == tmp_path / "accuracy.json"
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    (scalar,) = events.Scalars("eval/classifier_accuracy_ddim25")
    assert scalar.step == 40 and scalar.value == pytest.approx(0.75)


def test_the_evaluator_is_clean_and_never_the_guide(tmp_path, evaluator):
    noisy = classifier_checkpoint(tmp_path / "noisy", noised=True)
    np.savez(tmp_path / "samples_40x16x16x1.npz", images(0), np.zeros(40, dtype=np.int64))
    with pytest.raises(UserInputError, match=r"noisy classifier .* never the network"):
        run_accuracy(samples=str(tmp_path), classifier=str(noisy))
    (tmp_path / "sampling.json").write_text(json.dumps({"classifier": str(evaluator)}))
    with pytest.raises(UserInputError, match="is the classifier that guided these samples"):
        run_accuracy(samples=str(tmp_path), classifier=str(evaluator))
    with pytest.raises(UserInputError, match="is the classifier that guided these samples"):
        run_fid(samples=str(tmp_path), reference=str(tmp_path), features=str(evaluator))
    unlabelled = tmp_path / "unlabelled"
    unlabelled.mkdir()
    np.savez(unlabelled / "samples_40x16x16x1.npz", images(0))
    with pytest.raises(UserInputError, match=r"has no arr_1 \(labels\)"):
        run_accuracy(samples=str(unlabelled), classifier=str(evaluator))
    with pytest.raises(ConfigError, match="drop --inception"):
        FidOptions(samples="s", features="c", inception="i")


def test_frechet_distance_in_classifier_features(tmp_path, evaluator):
    """A set against itself is about 0, against noise large; the results never say FID."""
    reference, other, noise = (tmp_path / name for name in ("reference", "other", "noise"))
    for folder in (reference, other, noise):
        folder.mkdir()
    np.savez(reference / "ref.npz", images(0, count=200))
    np.savez(other / "samples_200x16x16x1.npz", images(1, count=200))  # the same distribution
    rng = np.random.default_rng(2)
    np.savez(noise / "samples_200x16x16x1.npz", rng.integers(0, 256, (200, 16, 16, 1), np.uint8))

    def fd(samples: Path) -> dict:
        reference_npz = str(reference / "ref.npz")
        return run_fid(samples=str(samples), reference=reference_npz, features=str(evaluator))

    itself = fd(reference / "ref.npz").summary
    same, noisy = fd(other), fd(noise)
    assert "fid" not in itself and itself["fd_classifier"] == pytest.approx(0, abs=1e-6)
    assert itself["precision_classifier"] == itself["recall_classifier"] == 1.0
    assert noisy.summary["fd_classifier"] > 20 * max(same.summary["fd_classifier"], 1e-3)
    assert Path(noisy.json_path).name == "fd_classifier_test.json"
    assert {"kd_classifier_mean", "kd_classifier_std", "features"} <= set(same.summary)
