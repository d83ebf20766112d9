"""Classifier guidance: guided-diffusion's classifier from its flags, its cond_fn, and samples
that move towards the classes asked for."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny_model import tiny_unet

from raydiff.config import DiffusionConfig, ExperimentConfig, apply_overrides
from raydiff.errors import UserInputError
from raydiff.factory import create_classifier, create_gaussian_diffusion
from raydiff.sample.classifier import (
    check_guides,
    classifier_cond_fn,
    classifier_config_from_flags,
    load_classifier,
)
from raydiff.sample.generate import generate
from raydiff.sample.load import load_sampling_model, parse_model_flags

pytestmark = pytest.mark.unit

FLAGS = (
    "--classifier_width 32 --classifier_depth 1 --classifier_attention_resolutions '' "
    "--classifier_pool adaptive --classifier_channel_mult 1,2"
)

MODEL = apply_overrides(
    ExperimentConfig(),
    [
        "model.image_size=8",
        "model.in_channels=1",
        "model.num_classes=4",
        "model.num_channels=32",
        "model.channel_mult=1,2",
        "model.attention_resolutions=",
        "diffusion.diffusion_steps=40",
    ],
)
"""The (unconditional) diffusion model a published classifier's flags complete."""


def tiny_classifier(flags: str = FLAGS):
    config = classifier_config_from_flags(parse_model_flags(flags), model_config=MODEL)
    torch.manual_seed(1)
    classifier = create_classifier(config)
    with torch.no_grad():  # the output conv starts at zero: give it weights
        for param in classifier.parameters():
            if not param.any():
                param.normal_(std=0.5)
    return config, classifier.eval()


def test_flags_follow_guided_diffusion():
    config, classifier = tiny_classifier()
    model = config.model
    assert (model.image_size, model.in_channels, model.num_classes) == (8, 1, 4)
    assert config.classifier.channel_mult(8) == (1, 2) and classifier.out_channels == 4
    # guided-diffusion's defaults at 64x64: its create_classifier's multipliers and attention.
    default = classifier_config_from_flags({}, model_config=ExperimentConfig())
    assert default.classifier.channel_mult(64) == (1, 2, 3, 4)
    assert default.classifier.attention_downsample_rates(64) == (2, 4, 8)
    assert default.classifier.classifier_pool == "attention"
    assert default.classifier.classifier_width == 128
    with pytest.raises(UserInputError, match=r"classifier: unknown key 'classifier_widht'"):
        classifier_config_from_flags({"classifier_widht": "3"}, model_config=MODEL)
    with pytest.raises(UserInputError, match=r"classifier_channel_mult='' .* image_size 8"):
        classifier_config_from_flags({"classifier_attention_resolutions": ""}, model_config=MODEL)
    with pytest.raises(UserInputError, match=r"32 does not divide image_size 8"):
        classifier_config_from_flags({"classifier_channel_mult": "1,2"}, model_config=MODEL)


def test_a_classifier_file_loads_only_with_its_flags(tmp_path):
    _, classifier = tiny_classifier()
    path = tmp_path / "classifier.pt"
    torch.save(classifier.state_dict(), path)
    loaded = load_classifier(path, flags=parse_model_flags(FLAGS), model_config=MODEL)
    x, t = torch.randn(2, 1, 8, 8), torch.tensor([3, 5])
    torch.testing.assert_close(loaded.network(x, t), classifier(x, t))
    wider = parse_model_flags(FLAGS.replace("--classifier_width 32", "--classifier_width 64"))
    with pytest.raises(UserInputError, match="does not match"):
        load_classifier(path, flags=wider, model_config=MODEL)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_classifier(tmp_path / "nope.pt", flags=parse_model_flags(FLAGS), model_config=MODEL)


def test_a_classifier_checkpoint_guides_only_a_model_it_fits(tmp_path):
    """A raydiff classifier checkpoint loads from its config.json; a diffusion checkpoint is not
    a classifier (and a classifier is not a diffusion model); other images, classes or
    diffusion steps are refused in one line."""
    from raydiff.config import to_dict
    from raydiff.train.checkpoint import save_checkpoint

    config, classifier = tiny_classifier()
    folder = save_checkpoint(
        tmp_path,
        10,
        model_state=classifier.state_dict(),
        ema_states={},
        trainer_state={"step": 10},
        config=to_dict(config),
    )
    loaded = load_classifier(folder)
    x, t = torch.randn(2, 1, 8, 8), torch.tensor([3, 5])
    torch.testing.assert_close(loaded.network(x, t), classifier(x, t))
    with pytest.raises(UserInputError, match=r"its config\.json describes the classifier"):
        load_classifier(folder, flags={"classifier_depth": "2"})
    with pytest.raises(UserInputError, match=r"train\.task=.classifier., not of a diffusion model"):
        load_sampling_model(folder)
    check_guides(loaded.config, MODEL, name="--classifier C")
    other = apply_overrides(MODEL, ["model.image_size=16"])
    with pytest.raises(UserInputError, match=r"classifies 8x8x1 images, the model draws 16x16x1"):
        check_guides(loaded.config, other, name="--classifier C")
    cond = apply_overrides(MODEL, ["model.class_cond=true", "model.num_classes=10"])
    with pytest.raises(UserInputError, match="C has 4 classes, the model 10"):
        check_guides(loaded.config, cond, name="C")
    longer = apply_overrides(MODEL, ["diffusion.diffusion_steps=100"])
    with pytest.raises(UserInputError, match="T=40 diffusion steps, the model on T=100"):
        check_guides(loaded.config, longer, name="C")


def test_cond_fn_is_the_scaled_gradient_of_log_p_y_given_x():
    _, classifier = tiny_classifier()
    x, t, y = torch.randn(3, 1, 8, 8), torch.tensor([1, 2, 3]), torch.tensor([0, 3, 1])
    gradient = classifier_cond_fn(classifier, scale=2.5)(x, t, y=y)
    x_in = x.clone().requires_grad_(True)
    log_p = F.log_softmax(classifier(x_in, t), dim=-1)[torch.arange(3), y].sum()
    (expected,) = torch.autograd.grad(log_p, x_in)
    torch.testing.assert_close(gradient, 2.5 * expected)


def test_guided_samples_move_towards_their_classes():
    """An unconditional model guided by a classifier: log p(y | x_0) of the samples rises with
    the scale (the model never sees y)."""
    _, classifier = tiny_classifier()
    model = tiny_unet()  # unconditional
    diffusion = create_gaussian_diffusion(
        DiffusionConfig(diffusion_steps=40, noise_schedule="cosine", timestep_respacing="10")
    )
    labels = torch.tensor([0, 1, 2, 3] * 2).numpy()

    def log_p(scale: float) -> float:
        images = generate(
            model,
            diffusion,
            indices=range(8),
            image_shape=(1, 8, 8),
            seed=0,
            labels=labels,
            cond_fn=classifier_cond_fn(classifier, scale=scale) if scale else None,
        )
        x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1
        with torch.no_grad():
            logits = classifier(x, torch.zeros(8, dtype=torch.long))
        return float(
            F.log_softmax(logits, dim=-1)[torch.arange(8), torch.from_numpy(labels)].mean()
        )

    assert log_p(0.0) < log_p(5.0) < log_p(50.0)
