"""Classifier guidance: guided-diffusion's classifier from its flags, its cond_fn, and samples
that move towards the classes asked for."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_sample_generate import tiny_model  # tests/unit is on sys.path (pytest prepend mode)

from raydiff.config import DiffusionConfig
from raydiff.errors import UserInputError
from raydiff.factory import create_gaussian_diffusion
from raydiff.sample.classifier import (
    classifier_cond_fn,
    classifier_config_from_flags,
    create_classifier,
    load_classifier,
)
from raydiff.sample.generate import generate
from raydiff.sample.load import parse_model_flags

pytestmark = pytest.mark.unit

FLAGS = (
    "--classifier_width 32 --classifier_depth 1 --classifier_attention_resolutions '' "
    "--classifier_pool adaptive --classifier_channel_mult 1,2"
)


def tiny_classifier(flags: str = FLAGS):
    config = classifier_config_from_flags(
        parse_model_flags(flags), image_size=8, in_channels=1, num_classes=4
    )
    torch.manual_seed(1)
    classifier = create_classifier(config)
    with torch.no_grad():  # the output conv starts at zero: give it weights
        for param in classifier.parameters():
            if not param.any():
                param.normal_(std=0.5)
    return config, classifier.eval()


def test_flags_follow_guided_diffusion():
    config, classifier = tiny_classifier()
    assert (config.image_size, config.in_channels, config.num_classes) == (8, 1, 4)
    assert config.channel_mult() == (1, 2) and classifier.out_channels == 4
    # guided-diffusion's defaults at 64x64: its create_classifier's multipliers and attention.
    default = classifier_config_from_flags({}, image_size=64, in_channels=3, num_classes=1000)
    assert default.channel_mult() == (1, 2, 3, 4)
    assert default.attention_downsample_rates() == (2, 4, 8)
    assert default.classifier_pool == "attention" and default.classifier_width == 128
    with pytest.raises(UserInputError, match="unknown --classifier-flags field"):
        classifier_config_from_flags(
            {"classifier_widht": "3"}, image_size=64, in_channels=3, num_classes=10
        )
    with pytest.raises(UserInputError, match="add --classifier_channel_mult"):
        classifier_config_from_flags({}, image_size=8, in_channels=1, num_classes=4)


def test_a_classifier_file_loads_only_with_its_flags(tmp_path):
    config, classifier = tiny_classifier()
    path = tmp_path / "classifier.pt"
    torch.save(classifier.state_dict(), path)
    loaded = load_classifier(path, config)
    x, t = torch.randn(2, 1, 8, 8), torch.tensor([3, 5])
    torch.testing.assert_close(loaded(x, t), classifier(x, t))
    wider, _ = tiny_classifier(FLAGS.replace("--classifier_width 32", "--classifier_width 64"))
    with pytest.raises(UserInputError, match="does not match"):
        load_classifier(path, wider)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_classifier(tmp_path / "nope.pt", config)


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
    model = tiny_model()  # unconditional
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
