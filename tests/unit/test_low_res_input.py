"""``raydiff sample --low-res``: the images an upsampler is conditioned on, checked against it
before anything starts, and turned into its input as ``super_res_sample.py`` does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raydiff.config import config_from_flags
from raydiff.errors import UserInputError
from raydiff.sample.low_res import load_low_res, model_input_of
from raydiff.sample.options import SampleOptions
from raydiff.sample.outputs import write_npz

pytestmark = pytest.mark.unit


def upsampler(**flags: object):
    base = {
        "task": "super_res",
        "large_size": 16,
        "small_size": 4,
        "in_channels": 1,
        "channel_mult": "1,2",
        "attention_resolutions": "",
    }
    return config_from_flags({**base, **flags})


def test_images_and_labels_of_an_npz_or_a_sample_folder(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (5, 4, 4, 1), dtype=np.uint8)
    npz = write_npz(images, tmp_path / "base", labels=np.arange(5) % 3)
    for source in (npz, tmp_path / "base"):
        loaded = load_low_res(str(source), config=upsampler())
        np.testing.assert_array_equal(loaded.images, images)
        assert loaded.source == str(npz)
        # Sample i upsamples image i % 5 and carries its label.
        np.testing.assert_array_equal(loaded.labels_of(7), [0, 1, 2, 0, 1, 0, 1])
    x = model_input_of(images, range(3, 7))
    assert x.shape == (4, 1, 4, 4) and x.dtype == torch.float32
    expected = torch.from_numpy(images[[3, 4, 0, 1]].astype(np.float32) / 127.5 - 1)
    torch.testing.assert_close(x, expected.permute(0, 3, 1, 2), rtol=0, atol=0)
    assert x.min() >= -1 and x.max() <= 1


def test_images_that_do_not_fit_the_upsampler_are_refused_naming_both_sizes(tmp_path):
    npz = write_npz(np.zeros((2, 8, 8, 1), np.uint8), tmp_path / "a")
    with pytest.raises(UserInputError, match=r"holds 8x8x1 images; the upsampler takes 4x4x1"):
        load_low_res(str(npz), config=upsampler())
    rgb = write_npz(np.zeros((2, 4, 4, 3), np.uint8), tmp_path / "b")
    with pytest.raises(UserInputError, match=r"holds 4x4x3 images; .* takes 4x4x1.*16x16"):
        load_low_res(str(rgb), config=upsampler())
    unlabelled = write_npz(np.zeros((2, 4, 4, 1), np.uint8), tmp_path / "c")
    conditional = upsampler(class_cond=True, num_classes=3)
    with pytest.raises(UserInputError, match=r"no labels \(arr_1\).*class-conditional"):
        load_low_res(str(unlabelled), config=conditional)
    foreign = write_npz(np.zeros((2, 4, 4, 1), np.uint8), tmp_path / "d", labels=np.array([1, 7]))
    with pytest.raises(UserInputError, match=r"labels \[7\] are not classes .*0\.\.2"):
        load_low_res(str(foreign), config=conditional)
    with pytest.raises(UserInputError, match="does not exist"):
        load_low_res(str(tmp_path / "nope.npz"), config=upsampler())
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserInputError, match=r"a samples_\*\.npz file, or a folder holding one"):
        load_low_res(str(tmp_path / "empty"), config=upsampler())


def test_low_res_takes_no_classifier_or_class_labels():
    common = {"checkpoint": "c", "num_samples": 1, "out": "o", "low_res": "x.npz"}
    with pytest.raises(UserInputError, match="--low-res conditions an upsampler"):
        SampleOptions(**common, classifier="k")
    with pytest.raises(UserInputError, match="--low-res conditions an upsampler"):
        SampleOptions(**common, class_labels=(1,))


def test_an_upsampler_needs_low_res_and_a_base_model_refuses_it(tmp_path):
    """Each checkpoint is refused in one line where the other kind is expected, saying how it
    is sampled."""
    from tiny_model import tiny_model

    from raydiff.config import ExperimentConfig, apply_overrides, to_dict
    from raydiff.factory import create_model
    from raydiff.sample.load import load_sampling_model
    from raydiff.train.checkpoint import save_checkpoint

    def checkpoint(name: str, *overrides: str):
        config = apply_overrides(ExperimentConfig(), [*tiny_model(image_size=16), *overrides])
        upsampler = config.train.task == "super_res"
        state = create_model(config.model, learn_sigma=False, super_res=upsampler).state_dict()
        return save_checkpoint(
            tmp_path / name,
            1,
            model_state=state,
            ema_states={},
            trainer_state={"step": 1},
            config=to_dict(config),
        )

    sr = checkpoint("sr", "train.task=super_res", "super_res.small_size=4")
    base = checkpoint("base")
    with pytest.raises(UserInputError, match=r"train.task='super_res'.*--low-res SAMPLES\.npz"):
        load_sampling_model(sr, weights="model")
    with pytest.raises(UserInputError, match=r"train.task=.diffusion.*a diffusion model samples"):
        load_sampling_model(base, weights="model", task="super_res")
    loaded = load_sampling_model(sr, weights="model", task="super_res")
    assert type(loaded.model).__name__ == "SuperResModel"


def test_a_cascade_is_two_sampling_runs_with_their_own_steps():
    from raydiff.sample.options import cascade_stages

    options = SampleOptions(
        checkpoint="base/checkpoint_000010",
        num_samples=6,
        out="out/",
        timestep_respacing="ddim25",
        use_ddim=True,
        class_labels=(1, 2),
        seed=4,
        num_workers=2,
        upsampler="sr/checkpoint_000020",
        upsampler_respacing="100",
    )
    base, upsampled = cascade_stages(options)
    assert (base.out, base.upsampler, base.timestep_respacing) == ("out/base", None, "ddim25")
    assert base.class_labels == (1, 2) and base.use_ddim
    assert upsampled.checkpoint == "sr/checkpoint_000020" and upsampled.low_res == "out/base"
    assert (upsampled.out, upsampled.timestep_respacing) == ("out/upsampled", "100")
    assert not upsampled.use_ddim and upsampled.class_labels == ()
    assert (upsampled.seed, upsampled.num_workers, upsampled.num_samples) == (4, 2, 6)
    with pytest.raises(UserInputError, match="apply to a cascade: add --upsampler"):
        SampleOptions(checkpoint="c", num_samples=1, out="o", upsampler_respacing="10")
    with pytest.raises(UserInputError, match="--low-res gives an upsampler images of your own"):
        SampleOptions(checkpoint="c", num_samples=1, out="o", upsampler="u", low_res="x.npz")


def test_a_cascade_whose_base_does_not_fit_the_upsampler_is_refused():
    from raydiff.sample.low_res import check_cascade

    sr = upsampler()  # 4x4x1 -> 16x16
    check_cascade(config_from_flags({"image_size": 4, "in_channels": 1, "channel_mult": "1,2",
                                     "attention_resolutions": ""}), sr, base_classes=None,
                  name="sr")  # fmt: skip
    big = config_from_flags(
        {"image_size": 8, "in_channels": 1, "channel_mult": "1,2", "attention_resolutions": ""}
    )
    with pytest.raises(UserInputError, match=r"--upsampler sr takes 4x4x1 .*makes 8x8x1"):
        check_cascade(big, sr, base_classes=None, name="sr")
    small = config_from_flags(
        {"image_size": 4, "in_channels": 1, "channel_mult": "1,2", "attention_resolutions": ""}
    )
    conditional = upsampler(class_cond=True, num_classes=3)
    with pytest.raises(UserInputError, match=r"class-conditional: the base model's samples"):
        check_cascade(small, conditional, base_classes=None, name="sr")
    with pytest.raises(UserInputError, match=r"has 3 classes; the base samples' labels range"):
        check_cascade(small, conditional, base_classes=10, name="sr")
    check_cascade(small, conditional, base_classes=3, name="sr")
