"""Evaluation on the shared local cluster: bits/dim spread over workers. (Every checkpoint
evaluated while a run trains: test_storage_s3.py's run, on the evaluation actor that a local run
uses too; tests/unit/test_checkpoint_evaluation.py for its local files.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tiny_model import tiny_model

from raydiff.config import ExperimentConfig, apply_overrides, to_dict
from raydiff.factory import create_model
from raydiff.train.checkpoint import save_checkpoint

pytestmark = pytest.mark.integration


@pytest.fixture
def run_checkpoint(tmp_path, tiny_dataset):
    """A checkpoint of a tiny model (16x16x1, T = 20) inside a run folder."""
    config = apply_overrides(
        ExperimentConfig(),
        [
            *tiny_model(),
            "diffusion.diffusion_steps=20",
            "diffusion.noise_schedule=cosine",
            f"data.data_dir={tiny_dataset.path}",
        ],
    )
    torch.manual_seed(0)
    model = create_model(config.model, learn_sigma=False)
    with torch.no_grad():  # no zero-initialised layers: every term depends on the model
        for param in model.parameters():
            if not param.any():
                param.normal_(std=0.05)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(to_dict(config)))
    return save_checkpoint(
        run,
        12,
        model_state=model.state_dict(),
        ema_states={0.9999: model.state_dict()},
        trainer_state={"step": 12},
        config=to_dict(config),
    )


def test_bpd_is_the_same_on_one_and_two_workers_and_reaches_the_runs_tensorboard(
    ray_cluster, run_checkpoint, tmp_path
):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from raydiff.evaluate.options import BpdOptions
    from raydiff.orchestrate.model_actor import run_bpd

    results = {}
    for workers in (1, 2):
        options = BpdOptions(
            checkpoint=str(run_checkpoint),
            split="val",
            num_images=10,
            batch_size=3,
            num_workers=workers,
            out=str(tmp_path / f"out{workers}"),
        )
        results[workers] = run_bpd(options)
    one, two = results[1], results[2]
    with np.load(one.terms_path) as a, np.load(two.terms_path) as b:
        for key in ("total_bpd", "prior_bpd", "vb", "mse", "xstart_mse"):
            np.testing.assert_array_equal(a[key], b[key])
        assert a["vb"].shape == (10, 20)
        np.testing.assert_allclose(a["total_bpd"], a["prior_bpd"] + a["vb"].sum(1), rtol=1e-5)
    assert one.summary["bpd"] == two.summary["bpd"] and one.summary["num_images"] == 10
    assert json.loads(one.json_path.read_text())["bpd"] == one.summary["bpd"]
    run = run_checkpoint.parent
    assert one.tracked == [f"tensorboard: tensorboard --logdir {run.resolve() / 'tensorboard'}"]
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    # Both evaluations were of the run's checkpoint at step 12.
    expected = [(12, pytest.approx(one.summary["bpd"]))] * 2
    assert [(s.step, s.value) for s in events.Scalars("eval/bpd_val")] == expected
