"""`raydiff evaluate fid`: the missing-weights message, and samples that know their run."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tiny_model import TinyFeatures

from raydiff.config import config_from_flags, to_dict
from raydiff.evaluate import fid
from raydiff.evaluate.inception import INCEPTION_WEIGHTS_FILE
from raydiff.sample.outputs import SAMPLING_RECORD, write_npz

pytestmark = pytest.mark.unit


def test_without_the_weights_file_the_command_names_it(tmp_path, capsys, tiny_prepared):
    from raydiff.cli import main

    npz = write_npz(np.zeros((4, 8, 8, 1), np.uint8), tmp_path)
    argv = ["evaluate", "fid", "--samples", str(npz), "--reference", str(tiny_prepared)]
    assert main([*argv, "--inception", str(tmp_path / "nope.pth")]) == 1
    err = capsys.readouterr().err
    assert INCEPTION_WEIGHTS_FILE in err and "--inception" in err


def run_with_checkpoint(tmp_path, data_dir):
    """A run folder with a checkpoint of step 40 (configs only) of an 8x8x1 model trained on
    ``data_dir``: what samples' sampling.json may name."""
    config = config_from_flags(
        {
            "image_size": "8",
            "in_channels": "1",
            "channel_mult": "1,2",
            "attention_resolutions": "4",
            "data_dir": str(data_dir),
        }
    )
    run = tmp_path / "run"
    checkpoint = run / "checkpoint_000040"
    checkpoint.mkdir(parents=True)
    for folder in (run, checkpoint):
        (folder / "config.json").write_text(json.dumps(to_dict(config)))
    return run, checkpoint


def test_samples_of_a_runs_checkpoint_default_to_its_dataset_and_reach_its_tensorboard(
    tmp_path, tiny_prepared, monkeypatch
):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from raydiff.evaluate.samples_fid import run_fid

    monkeypatch.setattr(fid, "load_inception", lambda path, device="cpu": TinyFeatures())
    run, checkpoint = run_with_checkpoint(tmp_path, tiny_prepared)
    samples = tmp_path / "samples"
    rng = np.random.default_rng(0)
    write_npz(rng.integers(0, 256, (6, 8, 8, 1), dtype=np.uint8), samples)
    (samples / SAMPLING_RECORD).write_text(json.dumps({"checkpoint": str(checkpoint)}))

    result = run_fid(samples=str(samples), reference=None, split="train")
    assert result.summary["reference"] == str(tiny_prepared)
    assert result.summary["num_samples"] == 6 and result.summary["fid"] > 0
    assert json.loads((samples / "fid_train.json").read_text())["fid"] == result.summary["fid"]
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    (scalar,) = events.Scalars("eval/fid_train")
    assert scalar.step == 40 and scalar.value == pytest.approx(result.summary["fid"])
    for name in ("precision", "recall"):  # 6 samples: more than k = 3, so both are defined
        (scalar,) = events.Scalars(f"eval/{name}_train")
        assert scalar.step == 40 and scalar.value == pytest.approx(result.summary[name])


def test_each_sampler_of_one_checkpoint_gets_tensorboard_tags_of_its_own(
    tmp_path, tiny_prepared, monkeypatch
):
    """Samples of one checkpoint by 250 ancestral steps and by DDIM 25 guided at scale 4 land on
    its one step: each under its own tags, the full chain's under the plain ones."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from raydiff.evaluate.samples_fid import run_fid, sampler_suffix

    assert sampler_suffix({}) == ""
    assert sampler_suffix({"timestep_respacing": "", "use_ddim": False}) == ""
    assert sampler_suffix({"timestep_respacing": "250"}) == "_respaced250"
    assert sampler_suffix({"timestep_respacing": "ddim25", "use_ddim": True}) == "_ddim25"
    assert sampler_suffix({"timestep_respacing": "50", "use_ddim": True, "eta": 0.5}) == (
        "_ddim50_eta0.5"
    )
    assert sampler_suffix({"clip_denoised": False}) == "_noclip"
    # A scale without a classifier is not guidance (sampling.json keeps the default scale 1).
    assert sampler_suffix({"classifier": None, "classifier_scale": 1.0}) == ""
    assert sampler_suffix({"classifier": "c/checkpoint_000010", "classifier_scale": 4.0}) == (
        "_guided4"
    )
    assert sampler_suffix(
        {"use_ddim": True, "timestep_respacing": "ddim25", "precision": "bf16"}
    ) == ("_ddim25_bf16")
    assert sampler_suffix({"precision": "fp16"}) == "_fp16"
    assert sampler_suffix({"precision": "fp32"}) == ""  # fp32 (and records before --precision)

    monkeypatch.setattr(fid, "load_inception", lambda path, device="cpu": TinyFeatures())
    run, checkpoint = run_with_checkpoint(tmp_path, tiny_prepared)
    rng = np.random.default_rng(0)
    records = {
        "plain": {},
        "respaced": {"timestep_respacing": "250"},
        "guided": {
            "timestep_respacing": "ddim25",
            "use_ddim": True,
            "classifier": str(tmp_path / "classifier"),
            "classifier_scale": 4.0,
        },
    }
    fids = {}
    for name, record in records.items():
        samples = tmp_path / name
        write_npz(rng.integers(0, 256, (6, 8, 8, 1), dtype=np.uint8), samples)
        (samples / SAMPLING_RECORD).write_text(
            json.dumps({"checkpoint": str(checkpoint), **record})
        )
        fids[name] = run_fid(samples=str(samples), reference=None, split="train").summary["fid"]
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    for name, tag in [
        ("plain", "eval/fid_train"),
        ("respaced", "eval/fid_train_respaced250"),
        ("guided", "eval/fid_train_ddim25_guided4"),
    ]:
        (scalar,) = events.Scalars(tag)
        assert scalar.step == 40 and scalar.value == pytest.approx(fids[name]), tag
