"""One checkpoint's evaluation during training (the evaluation actor's work), without Ray."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from raydiff.config import (
    EvaluationConfig,
    apply_overrides,
    config_from_flags,
    load_config,
    to_dict,
)
from raydiff.errors import ConfigError
from raydiff.evaluate.checkpoint import evaluate_checkpoint
from raydiff.factory import create_model
from raydiff.sample.load import parse_model_flags
from raydiff.train.checkpoint import save_checkpoint

pytestmark = pytest.mark.unit

FLAGS = (
    "--image_size 8 --in_channels 1 --num_channels 32 --channel_mult 1,2 --num_res_blocks 1 "
    "--attention_resolutions '' --diffusion_steps 20 --noise_schedule cosine"
)


def test_a_checkpoint_gets_samples_bits_per_dim_and_tensorboard_entries(tmp_path, tiny_prepared):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = config_from_flags(parse_model_flags(f"{FLAGS} --data_dir {tiny_prepared}"))
    torch.manual_seed(0)
    model = create_model(config.model, learn_sigma=False)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(to_dict(config)))
    for step in (10, 20):
        checkpoint = save_checkpoint(
            run,
            step,
            model_state=model.state_dict(),
            ema_states={0.9999: model.state_dict()},
            trainer_state={"step": step},
            config=to_dict(config),
        )
        options = EvaluationConfig(num_samples=5, sample_respacing="ddim5", bpd_images=2)
        result = evaluate_checkpoint(checkpoint, run_dir=run, step=step, options=options)

    folder = run / "evaluation" / "checkpoint_000020"
    assert json.loads((folder / "evaluation.json").read_text()) == result
    assert result["step"] == 20 and result["weights"] == "ema_0.9999.pt"
    assert result["sample_precision"] == "fp32"  # auto on a CPU
    assert result["bpd_val_images"] == 2 and np.isfinite(result["bpd_val"])
    with np.load(folder / "samples_5x8x8x1.npz") as data:
        assert data["arr_0"].dtype == np.uint8 and "arr_1" not in data
    assert (folder / "grid.png").is_file()
    lines = (run / "evaluation" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [10, 20]
    # The same weights, images and noise at both steps: the same bound.
    assert json.loads(lines[0])["bpd_val"] == result["bpd_val"]

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert [s.step for s in events.Scalars("eval/bpd_val")] == [10, 20]
    assert [i.step for i in events.Images("eval/samples")] == [10, 20]


def test_bad_evaluation_settings_are_refused_naming_the_field():
    with pytest.raises(
        ConfigError, match=r"evaluation\.sample_precision='fp8' is invalid.*valid: fp32"
    ):
        EvaluationConfig(sample_precision="fp8")
    with pytest.raises(
        ConfigError, match=r"evaluation\.sample_precision='fp16' is invalid.*use_gpu"
    ):
        apply_overrides(load_config("demo"), ["evaluation.sample_precision=fp16"])
    with pytest.raises(ConfigError, match=r"evaluation\.num_samples=0 is invalid"):
        EvaluationConfig(num_samples=0)
    with pytest.raises(ConfigError, match=r"evaluation\.bpd_images=-1 is invalid"):
        EvaluationConfig(bpd_images=-1)
    with pytest.raises(ConfigError, match=r"evaluation\.sample_respacing='ddim8' is invalid"):
        config_from_flags(
            {
                "diffusion_steps": "20",
                "noise_schedule": "cosine",
                "every_checkpoint": "true",
                "sample_respacing": "ddim8",
            }
        )
