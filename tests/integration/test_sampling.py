"""``raydiff sample`` on the shared local cluster: the same images on 1 and 2 workers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raydiff.config import config_from_flags, to_dict
from raydiff.factory import create_model
from raydiff.sample.load import parse_model_flags
from raydiff.train.checkpoint import save_checkpoint

pytestmark = pytest.mark.integration

FLAGS = (
    "--image_size 8 --num_channels 32 --channel_mult 1,2 --num_res_blocks 1 "
    "--attention_resolutions '' --diffusion_steps 50 --class_cond True"
)


@pytest.fixture
def checkpoint(tmp_path):
    """A tiny class-conditional checkpoint whose layers are all non-zero (a fresh UNet's
    zero-initialised layers would make every sample the same function of its noise alone)."""
    config = config_from_flags(parse_model_flags(FLAGS))
    torch.manual_seed(0)
    model = create_model(config.model, learn_sigma=False)
    with torch.no_grad():
        for param in model.parameters():
            if not param.any():
                param.normal_(std=0.05)
    state = model.state_dict()
    return save_checkpoint(
        tmp_path / "run",
        10,
        model_state=state,
        ema_states={0.9999: state},
        trainer_state={"step": 10},
        config=to_dict(config),
    )


def test_samples_are_the_same_on_one_and_two_workers(ray_cluster, checkpoint, tmp_path):
    from raydiff.orchestrate.sampling import run_sampling
    from raydiff.sample.options import SampleOptions

    def run(workers: int):
        options = SampleOptions(
            checkpoint=str(checkpoint),
            num_samples=10,
            out=str(tmp_path / f"out{workers}"),
            timestep_respacing="ddim10",
            use_ddim=True,
            batch_size=4,
            num_workers=workers,
            seed=5,
        )
        result = run_sampling(options)
        with np.load(result.npz) as data:
            return result, data["arr_0"], data["arr_1"]

    one, images1, labels1 = run(1)
    two, images2, labels2 = run(2)
    assert one.npz.name == "samples_10x8x8x3.npz"
    assert images1.dtype == np.uint8 and images1.shape == (10, 8, 8, 3)
    np.testing.assert_array_equal(images1, images2)
    np.testing.assert_array_equal(labels1, labels2)
    assert labels1.dtype == np.int64 and set(labels1) <= set(range(1000))  # NUM_CLASSES
    assert len(list((tmp_path / "out2" / "images").glob("sample_*.png"))) == 10
    assert two.grid.is_file() and two.samples_per_s > 0
