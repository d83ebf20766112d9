"""``train.task=super_res``: improved-diffusion's upsampler (``super_res_train.py``) as a task of
the one loop: its config, its low-resolution input, its losses, bound and preview, and a
single-process run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tiny_model import tiny_model

from raydiff.config import ExperimentConfig, apply_overrides, config_from_flags
from raydiff.core.unet import SuperResModel
from raydiff.errors import ConfigError
from raydiff.train.tasks.diffusion import DiffusionTask
from raydiff.train.tasks.super_res import (
    LowResConditioning,
    low_res_of,
    preview_inputs,
    super_res_task,
)

pytestmark = pytest.mark.unit


def sr_config(*overrides: str, image_size: int = 16, small_size: int = 4) -> ExperimentConfig:
    return apply_overrides(
        ExperimentConfig(),
        [
            *tiny_model(image_size=image_size),
            "train.task=super_res",
            f"super_res.small_size={small_size}",
            "diffusion.diffusion_steps=50",
            "train.sample_count=3",
            "train.sample_steps=2",
            "train.eval_timesteps=4",
            *overrides,
        ],
    )


def test_the_low_resolution_input_is_the_mean_of_each_cell():
    """``F.interpolate(mode="area")`` as improved-diffusion's load_superres_data calls it: for an
    integer factor, each low-resolution pixel is the mean of its k x k cell of the large one."""
    x = torch.rand(2, 3, 16, 16) * 2 - 1
    low = low_res_of(x, 4)
    assert low.shape == (2, 3, 4, 4)
    cells = x.reshape(2, 3, 4, 4, 4, 4).mean(dim=(3, 5))
    torch.testing.assert_close(low, cells, rtol=0, atol=1e-6)
    assert torch.equal(low, F.interpolate(x, 4, mode="area"))


def test_the_originals_flags_give_the_upsamplers_config():
    """``--large_size`` is the model's image size, ``--small_size`` the input's."""
    config = config_from_flags(
        {
            "large_size": 32,
            "small_size": 8,
            "task": "super_res",
            "channel_mult": "1,2",
            "attention_resolutions": "16",
        }
    )
    assert (config.model.image_size, config.super_res.small_size) == (32, 8)
    with pytest.raises(ConfigError, match=r"super_res\.small_size=32 .*model\.image_size=32"):
        config_from_flags(
            {
                "large_size": 32,
                "small_size": 32,
                "task": "super_res",
                "channel_mult": "1,2",
                "attention_resolutions": "16",
            }
        )
    with pytest.raises(ConfigError, match=r"super_res\.small_size=0 .*>= 1"):
        config_from_flags({"small_size": 0})


class ValRuntime:
    """The one runtime member a task factory may call: validation images (and labels)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> None:
        self.images, self.labels = images, labels

    def val_batches(self, *, rows: range, batch_size: int):
        part = slice(rows.start, rows.stop)
        cond = {} if self.labels is None else {"y": self.labels[part]}
        return [(self.images[part], cond)]


def test_the_task_trains_and_evaluates_a_super_res_model_on_the_batchs_low_res():
    torch.manual_seed(0)
    config = sr_config()
    images = torch.rand(5, 1, 16, 16) * 2 - 1
    task = super_res_task(config, runtime=ValRuntime(images))
    assert isinstance(task, DiffusionTask) and isinstance(task.model, SuperResModel)
    assert isinstance(task.conditioning, LowResConditioning)
    with torch.no_grad():
        for p in task.model.parameters():  # a fresh UNet's zeroed output layer ignores inputs
            p.add_(torch.randn_like(p) * 0.05)
    t = torch.tensor([3, 40, 10, 0, 25])
    torch.manual_seed(1)
    losses = task.losses(task.model, {"x": images}, t)
    assert losses["loss"].shape == (5,) and torch.isfinite(losses["loss"]).all()
    # The loss is the model's on low_res of these images: another input changes it.
    torch.manual_seed(1)
    kwargs = {"low_res": low_res_of(images, 4)}
    direct = task.diffusion.training_losses(task.model, images, t, model_kwargs=kwargs)
    torch.testing.assert_close(losses["loss"], direct["loss"])
    torch.manual_seed(1)
    other = task.diffusion.training_losses(
        task.model, images, t, model_kwargs={"low_res": -kwargs["low_res"]}
    )
    assert not torch.allclose(losses["loss"], other["loss"])

    totals = task.evaluate(task.model, [(images, {})], seed=0)
    metrics = task.evaluation_metrics(totals)
    assert totals["count"] == 5 and np.isfinite(metrics["val_bpd"]) and metrics["val_bpd"] > 0


def test_evaluating_no_images_gives_every_total_zero():
    """A rank without val images sums the same keys as a rank with some."""
    torch.manual_seed(0)
    images = torch.rand(2, 1, 16, 16) * 2 - 1
    task = super_res_task(sr_config(), runtime=ValRuntime(images))
    with torch.no_grad():
        some = task.evaluate(task.model.eval(), [(images, {})], seed=0)
        none = task.evaluate(task.model, [], seed=0)
    assert set(none) == set(some) and all(float(v) == 0 for v in none.values())
    assert float(some["count"]) == 2


def test_the_preview_pairs_each_low_res_input_with_its_upsampling():
    torch.manual_seed(0)
    images = torch.rand(5, 1, 16, 16) * 2 - 1
    task = super_res_task(sr_config(), runtime=ValRuntime(images))
    grid = task.preview(task.model, seed=0)
    assert grid is not None and grid.shape == (6, 1, 16, 16)  # 3 inputs, 3 outputs
    assert task.preview_columns == 4  # pairs side by side: 2 pairs a row
    enlarged = F.interpolate(low_res_of(images[:3], 4), 16, mode="nearest")
    assert torch.equal(grid[0::2], enlarged)
    assert not torch.equal(grid[1::2], enlarged)
    torch.testing.assert_close(task.preview(task.model, seed=0), grid)  # a fixed seed
    # No val split: no inputs, no preview.
    none = super_res_task(sr_config(), runtime=ValRuntime(images[:0]))
    assert none.previewer.inputs is None and none.preview(none.model, seed=0) is None


def test_a_class_conditional_upsampler_previews_with_the_images_labels():
    labels = torch.tensor([2, 0, 1, 1])
    inputs = preview_inputs(ValRuntime(torch.zeros(4, 1, 16, 16), labels), count=3, small_size=4)
    assert inputs is not None and torch.equal(inputs["y"], labels[:3])
    config = sr_config("model.class_cond=true", "model.num_classes=3")
    task = super_res_task(config, runtime=ValRuntime(torch.zeros(4, 1, 16, 16), labels))
    assert task.preview(task.model, seed=0).shape == (6, 1, 16, 16)


def test_a_single_process_run_trains_an_upsampler(tiny_prepared, tmp_path):
    """8x8 images from 4x4: checkpoints, the bound at the end, the preview grid."""
    from raydiff.train.checkpoint import load_checkpoint
    from raydiff.train.local import run_single_process

    config = apply_overrides(
        sr_config(image_size=8, small_size=4),
        [
            f"data.data_dir={tiny_prepared}",
            "train.batch_size=4",
            "train.max_steps=4",
            "train.log_interval=2",
            "train.save_interval=4",
            "train.eval_num_images=4",
            "train.sample_count=2",
            "scaling.num_workers=1",
        ],
    )
    result = run_single_process(config, output_dir=tmp_path / "run")
    assert result["step"] == 4 and result["val_bpd"] > 0
    state = load_checkpoint(tmp_path / "run" / "checkpoint_000004")
    assert state["config"]["train"]["task"] == "super_res"
    assert state["config"]["super_res"] == {"small_size": 4}
    assert "input_blocks.0.0.weight" in state["model"]
    assert state["model"]["input_blocks.0.0.weight"].shape[1] == 2  # image + upsampled low_res
    assert list((tmp_path / "run" / "samples").glob("samples_000004.png"))
    assert json.loads((tmp_path / "run" / "config.json").read_text())["train"]["task"] == (
        "super_res"
    )


def test_a_published_upsamplers_flags_build_its_preset_network():
    """``--model-flags`` of guided-diffusion's 128 -> 512 upsampler (no channel_mult: its
    sr_create_model table, which differs from a base model's at 512) give the network of the
    preset whose state dict is the published one (tests/unit/test_presets.py)."""
    from raydiff.config import load_config
    from raydiff.factory import create_model
    from raydiff.sample.load import parse_model_flags

    flags = parse_model_flags(
        "--attention_resolutions 32,16 --class_cond True --diffusion_steps 1000 "
        "--large_size 512 --small_size 128 --learn_sigma True --noise_schedule linear "
        "--num_channels 192 --num_head_channels 64 --num_res_blocks 2 --resblock_updown True "
        "--use_fp16 True --use_scale_shift_norm True"
    )
    config = config_from_flags({**flags, "task": "super_res"})
    preset = load_config("upsampler_imagenet128_512")
    with torch.device("meta"):
        shapes = [
            {
                k: v.shape
                for k, v in create_model(c.model, learn_sigma=True, super_res=True)
                .state_dict()
                .items()
            }
            for c in (config, preset)
        ]
    assert shapes[0] == shapes[1]


def test_evaluate_bpd_takes_an_upsampler_and_gives_its_bound_given_low_res(tiny_prepared, tmp_path):
    """``raydiff evaluate bpd`` of an upsampler checkpoint: each image's bound given itself
    shrunk to ``small_size`` (the actors' ``image_bpd_terms(low_res_size=...)``), which another
    image's input changes."""
    from raydiff.config import to_dict
    from raydiff.evaluate.bpd import bpd_noise, image_bpd_terms
    from raydiff.evaluate.bpd_job import prepare_bpd
    from raydiff.evaluate.options import BpdOptions
    from raydiff.factory import create_gaussian_diffusion, create_model
    from raydiff.train.checkpoint import save_checkpoint

    config = apply_overrides(sr_config(image_size=8), [f"data.data_dir={tiny_prepared}"])
    torch.manual_seed(0)
    net = create_model(config.model, learn_sigma=False, super_res=True)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    checkpoint = save_checkpoint(
        tmp_path / "run",
        1,
        model_state=net.state_dict(),
        ema_states={},
        trainer_state={"step": 1},
        config=to_dict(config),
    )
    job = prepare_bpd(
        BpdOptions(
            checkpoint=str(checkpoint),
            weights="model",
            split="val",
            num_images=2,
            timestep_respacing="5",
            out=str(tmp_path / "bpd"),
        )
    )
    assert isinstance(job.loaded.model, SuperResModel)
    diffusion = create_gaussian_diffusion(job.diffusion_config)
    x = torch.tensor(job.images)
    terms = image_bpd_terms(
        job.loaded.model, diffusion, images=x, indices=range(2), seed=0, low_res_size=4
    )

    def bound(low_res: torch.Tensor) -> np.ndarray:
        with torch.no_grad():
            out = diffusion.calc_bpd_loop(
                job.loaded.model,
                x,
                model_kwargs={"low_res": low_res},
                generator=bpd_noise(0, range(2), device="cpu"),
            )
        return out["total_bpd"].double().numpy()

    np.testing.assert_array_equal(terms["total_bpd"], bound(low_res_of(x, 4)))
    assert not np.array_equal(terms["total_bpd"], bound(low_res_of(x.roll(1, dims=0), 4)))


def test_the_start_up_line_names_the_upsamplers_objective_and_input(caplog, tmp_path):
    from raydiff.train.build import build_rank_optimizer
    from raydiff.train.local import LocalRuntime
    from raydiff.train.tasks import task_of_config

    config = sr_config()
    runtime = LocalRuntime(
        config, output_dir=tmp_path, resume=None, images=torch.zeros(4, 1, 16, 16), labels=None
    )
    with caplog.at_level("INFO", logger="raydiff.train.build"):
        build_rank_optimizer(config, runtime=runtime, make_task=task_of_config)
    [line] = [r.getMessage() for r in caplog.records if "parameters" in r.getMessage()]
    assert line.startswith("super_res: ")
    assert "given 4x4 inputs upsampled to 16x16" in line and "cross-entropy" not in line
