"""The full bound per image, independent of batching; result files; `raydiff evaluate bpd` refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from raydiff.config import DiffusionConfig, config_from_flags, to_dict
from raydiff.core import UNetModel
from raydiff.core.respace import space_timesteps
from raydiff.evaluate.bpd import (
    bpd_noise,
    concatenate_terms,
    image_bpd_terms,
    summarize_terms,
    walk_timesteps,
    write_terms,
)
from raydiff.evaluate.report import run_checkpoint, track, write_json
from raydiff.factory import create_gaussian_diffusion, create_model
from raydiff.sample.load import parse_model_flags
from raydiff.train.checkpoint import save_checkpoint

pytestmark = pytest.mark.unit

FLAGS = "--image_size 8 --num_channels 32 --channel_mult 1,2 --num_res_blocks 1 --attention_resolutions ''"


def tiny_model() -> UNetModel:
    torch.manual_seed(0)
    model = UNetModel(
        image_size=8,
        in_channels=1,
        model_channels=32,
        out_channels=2,  # learned range: the bound's terms use the model's variance
        num_res_blocks=1,
        attention_resolutions=(),
        channel_mult=(1, 2),
    )
    with torch.no_grad():  # no zero-initialised layers: every term depends on the model
        for param in model.parameters():
            if not param.any():
                param.normal_(std=0.05)
    return model.eval()


def diffusion(respacing: str = ""):
    return create_gaussian_diffusion(
        DiffusionConfig(
            diffusion_steps=20,
            noise_schedule="cosine",
            learn_sigma=True,
            timestep_respacing=respacing,
        )
    )


def images(n: int) -> torch.Tensor:
    return torch.rand(n, 1, 8, 8, generator=torch.Generator().manual_seed(1)) * 2 - 1


def test_the_bound_is_the_sum_of_its_terms_and_matches_calc_bpd_loop():
    model, diff, x = tiny_model(), diffusion(), images(5)
    terms = image_bpd_terms(model, diff, images=x, indices=range(5), seed=3)
    assert terms["vb"].shape == (5, 20) and terms["total_bpd"].shape == (5,)
    np.testing.assert_allclose(
        terms["total_bpd"], terms["prior_bpd"] + terms["vb"].sum(axis=1), rtol=1e-6
    )
    # One process, one batch, calc_bpd_loop itself with the same per-image noise.
    with torch.no_grad():
        reference = diff.calc_bpd_loop(model, x, generator=bpd_noise(3, range(5), device="cpu"))
    np.testing.assert_allclose(terms["total_bpd"], reference["total_bpd"].double(), rtol=1e-5)
    np.testing.assert_allclose(terms["vb"], reference["vb"].double(), rtol=1e-5, atol=1e-7)


def test_an_images_terms_do_not_depend_on_its_batch():
    model, diff, x = tiny_model(), diffusion(), images(6)
    whole = image_bpd_terms(model, diff, images=x, indices=range(6), seed=7)
    parts = concatenate_terms(
        [
            image_bpd_terms(model, diff, images=x[:2], indices=range(0, 2), seed=7),
            image_bpd_terms(model, diff, images=x[2:], indices=range(2, 6), seed=7),
        ]
    )
    for key in whole:
        np.testing.assert_allclose(parts[key], whole[key], rtol=1e-5, atol=1e-7)
    other_seed = image_bpd_terms(model, diff, images=x, indices=range(6), seed=8)
    assert not np.allclose(other_seed["vb"], whole["vb"])


def test_summary_and_terms_file(tmp_path):
    model, diff, x = tiny_model(), diffusion("5"), images(4)
    terms = image_bpd_terms(model, diff, images=x, indices=range(4), seed=0)
    summary = summarize_terms(terms, num_timesteps=diff.num_timesteps)
    assert summary["bpd"] == pytest.approx(float(terms["total_bpd"].mean()))
    assert summary["bpd"] == pytest.approx(
        summary["prior_bpd"] + summary["decoder_bpd"] + summary["middle_bpd"]
    )
    assert summary["bpd_stderr"] == pytest.approx(terms["total_bpd"].std(ddof=1) / 2)
    assert summary["num_images"] == 4 and summary["num_timesteps"] == 5
    # A respaced walk's columns are its kept steps of the base process, T-1 first.
    assert walk_timesteps(diff) == sorted(space_timesteps(20, "5"), reverse=True)
    assert walk_timesteps(diffusion()) == list(range(19, -1, -1))
    path = write_terms(tmp_path / "t.npz", terms, timesteps=walk_timesteps(diff), indices=range(4))
    with np.load(path) as data:
        assert set(data.files) == {*terms, "timesteps", "indices"}
        assert data["vb"].shape == (4, 5) and list(data["indices"]) == [0, 1, 2, 3]
    assert not list(tmp_path.glob("*.tmp*"))


def test_results_of_a_runs_checkpoint_go_to_its_folder_and_trackers(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = config_from_flags(parse_model_flags(FLAGS))
    model = create_model(config.model, learn_sigma=False)
    run = tmp_path / "run"
    checkpoint = save_checkpoint(
        run,
        30,
        model_state=model.state_dict(),
        ema_states={},
        trainer_state={"step": 30},
        config=to_dict(config),
    )
    assert run_checkpoint(checkpoint) is None  # not a run yet: no config.json beside it
    (run / "config.json").write_text(json.dumps(to_dict(config)))
    found = run_checkpoint(checkpoint)
    assert found is not None and found.step == 30 and found.run_dir == run.resolve()
    assert found.results_dir == run.resolve() / "evaluation" / "checkpoint_000030"
    assert run_checkpoint(tmp_path) is None

    path = write_json(found.results_dir / "r.json", {"bpd": 3.5, "stderr": float("nan")})
    assert json.loads(path.read_text()) == {"bpd": 3.5, "stderr": None}
    assert track(found, scalars={"bpd_test": 3.5, "skipped": float("nan")}) == [
        f"tensorboard: tensorboard --logdir {run.resolve() / 'tensorboard'}"
    ]
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert events.Tags()["scalars"] == ["eval/bpd_test"]
    (scalar,) = events.Scalars("eval/bpd_test")
    assert (scalar.step, scalar.value) == (30, 3.5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--num-images", "0"], "--num-images 0 is invalid"),
        (["--batch-size", "0"], "--batch-size 0 is invalid"),
        (["--split", "nope"], "has no split 'nope'; its splits: train, val"),
        (["--weights", "ema_0.1"], "--weights ema_0.1"),
        (["--timestep-respacing", "ddim8"], "cannot create exactly 8 steps"),
    ],
)
def test_evaluate_bpd_refuses_bad_requests_before_anything_starts(
    tmp_path, capsys, tiny_prepared, args, message
):
    from raydiff.cli import main

    config = config_from_flags(
        parse_model_flags(
            f"{FLAGS} --in_channels 1 --diffusion_steps 20 --noise_schedule cosine "
            f"--data_dir {tiny_prepared}"
        )
    )
    model = create_model(config.model, learn_sigma=False)
    checkpoint = save_checkpoint(
        tmp_path / "run",
        1,
        model_state=model.state_dict(),
        ema_states={0.9999: model.state_dict()},
        trainer_state={"step": 1},
        config=to_dict(config),
    )
    (tmp_path / "run" / "config.json").write_text(json.dumps(to_dict(config)))
    assert main(["evaluate", "bpd", "--checkpoint", str(checkpoint), *args]) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run" / "evaluation").exists()
    import ray

    assert not ray.is_initialized()


def test_evaluate_bpd_of_a_published_file_needs_out(tmp_path, capsys):
    from raydiff.cli import main

    flags = FLAGS
    model = create_model(config_from_flags(parse_model_flags(flags)).model, learn_sigma=False)
    torch.save(model.state_dict(), tmp_path / "model.pt")
    argv = ["evaluate", "bpd", "--checkpoint", str(tmp_path / "model.pt"), "--model-flags", flags]
    assert main(argv) == 1
    assert "say where the results go with --out" in capsys.readouterr().err
