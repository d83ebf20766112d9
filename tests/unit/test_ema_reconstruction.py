"""``raydiff ema``: post-hoc EMA lengths reconstructed from a real run's snapshots, written into
its checkpoint, loaded by the sampling commands; impossible requests refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_model import tiny_model

from raydiff.cli import main
from raydiff.config import ExperimentConfig, apply_overrides
from raydiff.ema.reconstruction import EmaOptions, parse_lengths, reconstruct_ema
from raydiff.errors import ConfigError, UserInputError
from raydiff.train.local import LocalRuntime
from raydiff.train.loop import run_loop

STEPS = 40


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 steps of a tiny model tracking sigma_rel 0.05 and 0.10, a snapshot every 2 steps, a
    checkpoint every 4 (and a fixed EMA of 0.9 beside them)."""
    out = tmp_path_factory.mktemp("posthoc") / "run"
    config = apply_overrides(
        ExperimentConfig(),
        [
            *tiny_model(image_size=8),
            "diffusion.diffusion_steps=40",
            "train.batch_size=8",
            f"train.max_steps={STEPS}",
            "train.save_interval=4",
            "train.sample_interval=0",
            "train.eval_interval=0",
            "optim.lr=1e-3",
            "optim.ema_rate=0.9",
            "optim.posthoc_ema_stds=0.05,0.10",
            "optim.posthoc_ema_interval=2",
        ],
    )
    images = torch.rand(32, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    runtime = LocalRuntime(config, output_dir=out, resume=None, images=images, labels=None)
    run_loop(config, runtime=runtime, output_dir=out)
    return out


def test_a_tracked_length_at_a_snapshot_step_is_that_snapshot(run_dir: Path) -> None:
    [written] = reconstruct_ema(EmaOptions(run=str(run_dir), sigma_rel=(0.05,), step=8))
    assert written.path == run_dir / "checkpoint_000008" / "phema_0.050.pt"
    weights = torch.load(written.path, weights_only=True)
    snapshot = torch.load(run_dir / "posthoc_ema" / "snapshot_0000008.pt", weights_only=True)
    for name, value in snapshot["profiles"]["0.050"].items():
        torch.testing.assert_close(weights[name], value.float(), atol=1e-5, rtol=0)


def test_lengths_between_the_tracked_ones_load_for_sampling(run_dir: Path, capsys) -> None:
    from raydiff.sample.load import load_sampling_model

    assert main(["ema", "--run", str(run_dir), "--sigma-rel", "0.06:0.09:4"]) == 0
    out = capsys.readouterr().out
    assert "phema_0.070" in out and "--weights phema_0.060" in out
    newest = run_dir / f"checkpoint_{STEPS:06d}"
    for name in ("phema_0.060", "phema_0.070", "phema_0.080", "phema_0.090"):
        loaded = load_sampling_model(newest, weights=name)
        assert loaded.weights == newest / f"{name}.pt"
    # Between the two tracked profiles, the weights lie between theirs.
    a = torch.load(newest / "phema_0.060.pt", weights_only=True)
    b = torch.load(newest / "phema_0.090.pt", weights_only=True)
    assert any(not torch.equal(a[k], b[k]) for k in a)


def test_a_rate_is_taken_as_its_length_at_the_step(run_dir: Path, capsys) -> None:
    from raydiff.train.posthoc_ema import rate_to_sigma_rel

    # 0.73 per step at step 40: an exponential profile of relative std 1 / (-ln(0.73) * 40).
    [written] = reconstruct_ema(EmaOptions(run=str(run_dir), rate=(0.73,)))
    assert written.rate == 0.73
    assert written.sigma_rel == pytest.approx(rate_to_sigma_rel(0.73, step=STEPS))
    assert 0.05 < written.sigma_rel < 0.10
    assert written.path.name == f"phema_{written.sigma_rel:.3f}.pt"


def test_impossible_requests_are_refused_saying_what_is_possible(
    run_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(UserInputError, match=r"cannot be reconstructed well.*lengths that can"):
        reconstruct_ema(EmaOptions(run=str(run_dir), sigma_rel=(0.005,)))
    with pytest.raises(UserInputError, match=r"--step 3: .* no checkpoint_000003; its checkpoints"):
        reconstruct_ema(EmaOptions(run=str(run_dir), sigma_rel=(0.08,), step=3))
    odd = run_dir / "checkpoint_000005"  # a checkpoint between two snapshots
    (odd).mkdir()
    (odd / "config.json").write_text((run_dir / "checkpoint_000004" / "config.json").read_text())
    with pytest.raises(UserInputError, match=r"no post-hoc EMA snapshot at that step.*2, 4, 6"):
        reconstruct_ema(EmaOptions(run=str(run_dir), sigma_rel=(0.08,), step=5))
    with pytest.raises(UserInputError, match=r"no post-hoc EMA snapshots.*posthoc_ema_stds"):
        (tmp_path / "plain" / "checkpoint_000001").mkdir(parents=True)
        reconstruct_ema(EmaOptions(run=str(tmp_path / "plain"), sigma_rel=(0.08,), step=1))
    with pytest.raises(ConfigError, match=r"give --sigma-rel"):
        EmaOptions(run=str(run_dir))
    with pytest.raises(ConfigError, match=r"in \(0, 0.3\)"):
        EmaOptions(run=str(run_dir), sigma_rel=(0.4,))
    with pytest.raises(ValueError, match="START:STOP:N"):
        parse_lengths("0.05:x:3")
    assert parse_lengths("0.05:0.15:3") == pytest.approx((0.05, 0.10, 0.15))


def test_the_tracking_is_checked_and_announced(caplog) -> None:
    with pytest.raises(ConfigError, match=r"posthoc_ema_stds='0.05,0.5' is invalid"):
        apply_overrides(ExperimentConfig(), ["optim.posthoc_ema_stds=0.05,0.5"])
    with pytest.raises(ConfigError, match=r"posthoc_ema_interval=-1 is invalid"):
        apply_overrides(ExperimentConfig(), ["optim.posthoc_ema_interval=-1"])


def test_a_classifier_guides_with_a_reconstructed_length(tmp_path: Path) -> None:
    """A classifier run tracks post-hoc EMA too; `raydiff sample --classifier-weights
    phema_LENGTH` loads the reconstructed weights (and nothing without --classifier)."""
    from tiny_model import tiny_classifier

    from raydiff.sample.classifier import load_classifier
    from raydiff.sample.options import SampleOptions

    out = tmp_path / "classifier"
    config = apply_overrides(
        ExperimentConfig(),
        [
            *tiny_classifier(image_size=8, num_classes=3),
            "classifier.classifier_attention_resolutions=4",
            "diffusion.diffusion_steps=40",
            "train.batch_size=8",
            "train.max_steps=8",
            "train.save_interval=8",
            "train.sample_interval=0",
            "train.eval_interval=0",
            "optim.posthoc_ema_stds=0.05,0.10",
            "optim.posthoc_ema_interval=2",
        ],
    )
    images = torch.rand(16, 1, 8, 8, generator=torch.Generator().manual_seed(1)) * 2 - 1
    labels = torch.arange(16) % 3
    runtime = LocalRuntime(config, output_dir=out, resume=None, images=images, labels=labels)
    run_loop(config, runtime=runtime, output_dir=out)
    [written] = reconstruct_ema(EmaOptions(run=str(out), sigma_rel=(0.1,)))
    guide = load_classifier(out / "checkpoint_000008", weights="phema_0.100")
    expected = torch.load(written.path, weights_only=True)
    for name, value in guide.network.state_dict().items():
        torch.testing.assert_close(value.float(), expected[name].float())
    with pytest.raises(UserInputError, match=r"--classifier-weights .* add --classifier PATH"):
        SampleOptions(checkpoint="c", num_samples=1, out="o", classifier_weights="phema_0.070")
