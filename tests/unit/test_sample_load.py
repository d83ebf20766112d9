"""Loading the model to sample from: raydiff checkpoints and published .pt files."""

from __future__ import annotations

import pytest
import torch
import yaml

from raydiff.config import config_from_flags, load_config, to_dict
from raydiff.errors import UserInputError
from raydiff.factory import create_model
from raydiff.sample.load import load_sampling_model, parse_model_flags
from raydiff.train.checkpoint import save_checkpoint

pytestmark = pytest.mark.unit

FLAGS = "--image_size 8 --num_channels 32 --channel_mult 1,2 --num_res_blocks 1 --attention_resolutions ''"


def _state(model: torch.nn.Module, value: float) -> dict[str, torch.Tensor]:
    return {k: torch.full_like(v, value) for k, v in model.state_dict().items()}


@pytest.fixture
def checkpoint(tmp_path):
    config = config_from_flags({**parse_model_flags(FLAGS), "ema_rate": "0.99,0.5"})
    model = create_model(config.model, learn_sigma=config.diffusion.learn_sigma)
    return save_checkpoint(
        tmp_path / "run",
        4,
        model_state=_state(model, 1.0),
        ema_states={0.99: _state(model, 2.0), 0.5: _state(model, 3.0)},
        trainer_state={"step": 4},
        config=to_dict(config),
    )


def _first_weight(loaded) -> float:
    return float(next(iter(loaded.model.state_dict().values())).flatten()[0])


def test_a_raydiff_checkpoint_loads_its_first_ema_by_default_or_the_weights_asked_for(checkpoint):
    assert _first_weight(load_sampling_model(checkpoint)) == 2.0  # ema_0.99, the first rate
    assert _first_weight(load_sampling_model(checkpoint, weights="ema_0.5")) == 3.0
    loaded = load_sampling_model(checkpoint, weights="model")
    assert _first_weight(loaded) == 1.0 and loaded.config.model.image_size == 8
    assert not loaded.model.training
    with pytest.raises(UserInputError, match=r"valid: model, ema_0\.5, ema_0\.99"):
        load_sampling_model(checkpoint, weights="ema_0.9999")


def test_missing_and_partial_checkpoints_are_named(checkpoint, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_sampling_model(tmp_path / "nope")
    (checkpoint / "ema_0.5.pt").unlink()  # a crash mid-copy
    with pytest.raises(FileNotFoundError, match=r"incomplete checkpoint: ema_0\.5\.pt is missing"):
        load_sampling_model(checkpoint)
    with pytest.raises(FileNotFoundError, match="not a raydiff checkpoint"):
        load_sampling_model(tmp_path)


def test_a_published_state_dict_loads_with_its_flags(tmp_path):
    config = config_from_flags(parse_model_flags(FLAGS + " --learn_sigma True"))
    model = create_model(config.model, learn_sigma=True)
    torch.save(_state(model, 0.25), tmp_path / "ema_0.9999_500000.pt")
    loaded = load_sampling_model(
        tmp_path / "ema_0.9999_500000.pt", model_flags=FLAGS + " --learn_sigma True"
    )
    assert _first_weight(loaded) == 0.25 and loaded.config.diffusion.learn_sigma
    with pytest.raises(UserInputError, match="does not match the configured model"):
        load_sampling_model(tmp_path / "ema_0.9999_500000.pt", model_flags=FLAGS)  # no learn_sigma
    with pytest.raises(UserInputError, match="describe its model with --model-flags"):
        load_sampling_model(tmp_path / "ema_0.9999_500000.pt")
    config_file = tmp_path / "model.yaml"
    config_file.write_text(yaml.safe_dump(to_dict(config)))
    assert (
        _first_weight(
            load_sampling_model(tmp_path / "ema_0.9999_500000.pt", config_file=str(config_file))
        )
        == 0.25
    )
    assert load_config(str(config_file)).diffusion.learn_sigma


def test_model_flags_use_improved_diffusions_syntax():
    assert parse_model_flags(
        "--image_size 64 --learn_sigma=True --attention_resolutions '16,8'"
    ) == {
        "image_size": "64",
        "learn_sigma": "True",
        "attention_resolutions": "16,8",
    }
    with pytest.raises(UserInputError, match="--num_channels has no value"):
        parse_model_flags("--image_size 64 --num_channels")
    with pytest.raises(UserInputError, match="'64' is not a flag"):
        parse_model_flags("64 --image_size")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--num-samples", "0"], "--num-samples 0 is invalid"),
        (["--num-samples", "4", "--weights", "ema_0.1"], "--weights ema_0.1"),
        (["--num-samples", "4", "--eta", "0.5"], "--eta applies to DDIM sampling"),
        (["--num-samples", "4", "--class-labels", "1,x"], "--class-labels '1,x' is invalid"),
        (["--num-samples", "4", "--class-labels", "1"], "not class-conditional"),
        (["--num-samples", "4", "--classifier-scale", "3"], "add --classifier PATH"),
        (
            ["--num-samples", "4", "--classifier", "nope.pt"],
            "--classifier 'nope.pt' does not exist",
        ),
        (
            ["--num-samples", "4", "--classifier", "nope.pt", "--classifier-scale", "-1"],
            "--classifier-scale -1.0 is invalid",
        ),
        (
            ["--num-samples", "4", "--timestep-respacing", "ddim3000"],
            "cannot create exactly 3000 steps",
        ),
        (
            ["--num-samples", "4", "--precision", "fp16"],
            "--precision 'fp16' is invalid: fp16 autocast needs --use-gpu",
        ),
    ],
)
def test_sample_cli_refuses_bad_requests_before_anything_starts(
    checkpoint, tmp_path, capsys, args, message
):
    from raydiff.cli import main

    out = tmp_path / "samples"
    assert main(["sample", "--checkpoint", str(checkpoint), "--out", str(out), *args]) == 1
    assert message in capsys.readouterr().err
    assert not out.exists()
    import ray

    assert not ray.is_initialized()
