"""The presets in configs/ load, validate, and build the published model sizes."""

from pathlib import Path

import pytest
import torch

from raydiff.config import load_config
from raydiff.factory import create_model

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PRESETS = sorted(p for p in CONFIGS.glob("*.yaml") if not p.stem.startswith(("sweep_", "family_")))
SWEEPS = sorted(CONFIGS.glob("sweep_*.yaml"))


def num_params(config) -> int:
    # On the meta device nothing is allocated: a 270M-parameter model costs nothing to count.
    with torch.device("meta"):
        model = create_model(config.model, learn_sigma=config.diffusion.learn_sigma)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_every_preset_loads_and_splits_its_batch(path):
    config = load_config(str(path))
    config.train.per_worker_batch(config.scaling.num_workers)


@pytest.mark.parametrize(
    "name,millions",
    [("cifar10_hybrid", 52.5), ("cifar10_vlb", 52.5), ("imagenet64_cond", 270), ("demo", 0.88)],
)
def test_published_model_sizes(name, millions):
    params = num_params(load_config(str(CONFIGS / f"{name}.yaml")))
    assert params / 1e6 == pytest.approx(millions, rel=0.02)


def test_presets_load_by_name_and_ship_inside_the_package():
    from raydiff.config import PRESETS_DIR, preset_names, resolve_config_path

    assert PRESETS_DIR.parent.name == "raydiff"  # package data: a wheel install has them too
    assert set(preset_names()) == {p.stem for p in PRESETS}
    assert resolve_config_path("cifar10_hybrid") == PRESETS_DIR / "cifar10_hybrid.yaml"
    assert load_config("demo") == load_config(str(CONFIGS / "demo.yaml"))
    with pytest.raises(FileNotFoundError, match="presets by name: cifar10_hybrid"):
        resolve_config_path("cifar11")


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_shipped_sweeps_are_not_presets_but_load_as_sweeps(path):
    from raydiff.errors import UserInputError
    from raydiff.sweep.spec import load_sweep

    assert load_sweep(path.stem).sweep == load_sweep(path).sweep  # by name, like presets
    with pytest.raises(UserInputError, match="is a sweep file"):
        load_config(str(path))
    with pytest.raises(FileNotFoundError):
        load_config(path.stem)


@pytest.mark.parametrize(
    "preset", ["classifier_imagenet64", "classifier_imagenet128", "classifier_imagenet256"]
)
def test_published_classifier_presets_have_the_published_state_dict(preset):
    """guided-diffusion's create_classifier with the preset's flags (its keys and shapes written
    by bench/make_reference_fixtures.py --classifier-keys) and raydiff's network of the preset:
    the same state dict, so the published NxN_classifier.pt loads strictly (65.4M, 42.6M and
    54.1M parameters)."""
    from raydiff.factory import create_classifier

    fixture = Path(__file__).parent / "fixtures" / "published_classifier_keys.txt"
    expected = {}
    for line in fixture.read_text().splitlines():
        name, key, shape = line.split() if not line.startswith("#") else ("", "", "")
        if name == preset:
            expected[key] = tuple(int(n) for n in shape.split(","))
    with torch.device("meta"):
        network = create_classifier(load_config(preset))
    assert {k: tuple(v.shape) for k, v in network.state_dict().items()} == expected


@pytest.mark.parametrize(
    "preset",
    ["upsampler_imagenet64_256", "upsampler_imagenet128_512", "upsampler_iddpm_imagenet64_256"],
)
def test_published_upsampler_presets_have_the_published_state_dict(preset):
    """sr_create_model with the preset's flags (guided-diffusion's, or improved-diffusion's for
    the iddpm preset; keys and shapes written by bench/make_reference_fixtures.py
    --upsampler-keys) and raydiff's upsampler of the preset: the same state dict, so the
    published NN_MMM_upsampler.pt and upsample_cond_500K.pt load strictly (the last one 280M
    parameters)."""
    from raydiff.factory import create_model

    fixture = Path(__file__).parent / "fixtures" / "published_upsampler_keys.txt"
    expected = {}
    for line in fixture.read_text().splitlines():
        name, key, shape = line.split() if not line.startswith("#") else ("", "", "")
        if name == preset:
            expected[key] = tuple(int(n) for n in shape.split(","))
    config = load_config(preset)
    assert config.train.task == "super_res"
    with torch.device("meta"):
        network = create_model(config.model, learn_sigma=True, super_res=True)
    assert {k: tuple(v.shape) for k, v in network.state_dict().items()} == expected
    if preset == "upsampler_iddpm_imagenet64_256":
        assert sum(p.numel() for p in network.parameters()) / 1e6 == pytest.approx(280, rel=0.01)
