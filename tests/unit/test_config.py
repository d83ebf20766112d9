"""Typed configs: defaults, validation messages, overrides, dict round trip."""

import dataclasses

import pytest

from raydiff.config import (
    DataConfig,
    DiffusionConfig,
    ExperimentConfig,
    ModelConfig,
    TrainConfig,
    apply_overrides,
    config_from_flags,
    derive_sections,
    from_dict,
    load_config,
    to_dict,
)
from raydiff.errors import ConfigError, UserInputError


def test_improved_diffusion_defaults():
    m, d = ModelConfig(), DiffusionConfig()
    assert (m.image_size, m.num_channels, m.num_res_blocks, m.num_heads) == (64, 128, 2, 4)
    assert m.attention_resolutions == "16,8" and m.use_scale_shift_norm and m.dropout == 0.0
    assert (d.diffusion_steps, d.noise_schedule, d.timestep_respacing) == (1000, "linear", "")
    assert d.rescale_timesteps and d.rescale_learned_sigmas and not d.learn_sigma


@pytest.mark.parametrize(
    "size,mult",
    [
        (32, (1, 2, 2, 2)),
        (64, (1, 2, 3, 4)),
        (128, (1, 1, 2, 3, 4)),
        (256, (1, 1, 2, 2, 4, 4)),
        (512, (0.5, 1, 1, 2, 2, 4, 4)),
    ],
)
def test_channel_mult_table(size, mult):
    assert ModelConfig(image_size=size, attention_resolutions="").channel_mult_tuple() == mult


def test_other_sizes_need_an_explicit_channel_mult():
    with pytest.raises(ValueError, match=r"model.channel_mult.*image_size 28.*explicitly"):
        ModelConfig(image_size=28, attention_resolutions="")
    cfg = ModelConfig(image_size=28, channel_mult="1,2,2", attention_resolutions="7")
    assert cfg.attention_downsample_rates() == (4,)


def test_groupnorm_divisibility_is_explained():
    with pytest.raises(ValueError, match="divisible by 32"):
        ModelConfig(image_size=32, num_channels=48)


def test_attention_resolution_must_exist():
    with pytest.raises(ValueError, match=r"attention_resolutions.*valid: \[32, 16, 8, 4\]"):
        ModelConfig(image_size=32, attention_resolutions="12")


def test_diffusion_validation():
    with pytest.raises(ValueError, match=r"noise_schedule.*linear, cosine"):
        DiffusionConfig(noise_schedule="quadratic")
    with pytest.raises(ValueError, match="timestep_respacing"):
        DiffusionConfig(diffusion_steps=10, noise_schedule="cosine", timestep_respacing="ddim6")
    with pytest.raises(ValueError, match="linear schedule needs > 20"):
        DiffusionConfig(diffusion_steps=10)


def test_overrides_section_and_bare_names():
    cfg = apply_overrides(
        ExperimentConfig(),
        ["noise_schedule=cosine", "model.num_channels=64", "learn_sigma=True", "dropout=0.1"],
    )
    assert cfg.diffusion.noise_schedule == "cosine" and cfg.diffusion.learn_sigma is True
    assert cfg.model.num_channels == 64 and cfg.model.dropout == 0.1
    with pytest.raises(ValueError, match="unknown config field 'nosie_schedule'"):
        apply_overrides(ExperimentConfig(), ["nosie_schedule=cosine"])
    with pytest.raises(ValueError, match="expected True or False"):
        apply_overrides(ExperimentConfig(), ["learn_sigma=maybe"])
    with pytest.raises(ValueError, match="expected an integer"):
        apply_overrides(ExperimentConfig(), ["num_channels=1.5"])


def test_dict_round_trip_and_unknown_keys():
    cfg = apply_overrides(ExperimentConfig(), ["image_size=32", "use_kl=True"])
    assert from_dict(ExperimentConfig, to_dict(cfg)) == cfg
    with pytest.raises(ValueError, match="model: unknown key 'channels' \\(valid: image_size,"):
        from_dict(ExperimentConfig, {"model": {"channels": 3}})


def test_flags_of_a_published_model():
    cfg = config_from_flags(
        {
            "image_size": 64,
            "num_channels": 128,
            "num_res_blocks": 3,
            "learn_sigma": True,
            "diffusion_steps": 4000,
            "noise_schedule": "cosine",
        }
    )
    assert cfg.model.num_res_blocks == 3 and cfg.diffusion.diffusion_steps == 4000


def test_data_geometry_follows_the_model():
    cfg = apply_overrides(ExperimentConfig(), ["image_size=32", "in_channels=1", "seed=7"])
    assert (cfg.data.image_size, cfg.data.channels, cfg.data.seed) == (32, 1, 7)
    with pytest.raises(ValueError, match=r"data\.image_size follows model\.image_size"):
        apply_overrides(ExperimentConfig(), ["data.image_size=32"])
    assert from_dict(ExperimentConfig, to_dict(cfg)) == cfg


def test_derived_data_fields_are_checked_and_errors_name_their_source():
    with pytest.raises(ValueError, match=r"model\.in_channels=2 is invalid"):
        apply_overrides(ExperimentConfig(), ["in_channels=2"])
    with pytest.raises(ValueError, match=r"train\.seed=-1 is invalid"):
        apply_overrides(ExperimentConfig(), ["seed=-1"])
    # A YAML value for a derived field must agree with its source, not vanish.
    with pytest.raises(ConfigError, match=r"data\.seed=5 is invalid: it contradicts train\.seed=0"):
        from_dict(ExperimentConfig, {"data": {"seed": 5}})
    same = from_dict(ExperimentConfig, {"model": {"image_size": 32}, "data": {"image_size": 32}})
    assert same.data.image_size == 32
    # Overriding the source of a derived field re-derives it.
    assert apply_overrides(same, ["image_size=64"]).data.image_size == 64


def test_use_fp16_means_fp16_training():
    assert apply_overrides(ExperimentConfig(), ["use_fp16=True"]).train.precision == "fp16"
    with pytest.raises(ValueError, match=r"use_fp16=True .* train\.precision='bf16'"):
        apply_overrides(ExperimentConfig(), ["use_fp16=True", "precision=bf16"])


def test_no_section_changes_another():
    """Derived fields are filled in by one step (derive_sections) when a config is built from a
    mapping; ExperimentConfig itself only checks that its sections agree."""
    model, train, data = ModelConfig(use_fp16=True, image_size=32), TrainConfig(), DataConfig()
    with pytest.raises(ConfigError, match=r"data\.image_size=64 is invalid: it contradicts"):
        ExperimentConfig(model=model, train=train, data=data)
    with pytest.raises(ConfigError, match=r"use_fp16=True .* train\.precision='fp32'"):
        ExperimentConfig(model=ModelConfig(use_fp16=True), train=train)
    assert train.precision == "fp32" and data.image_size == 64  # nothing was changed
    sections = {name: getattr(ExperimentConfig(), name) for name in DATA_SECTIONS}
    sections["model"] = model
    derived = derive_sections(sections, {})
    assert derived["train"].precision == "fp16" and derived["data"].image_size == 32
    assert sections["train"].precision == "fp32" and sections["data"].image_size == 64
    assert ExperimentConfig(**derived).model is model


DATA_SECTIONS = tuple(f.name for f in dataclasses.fields(ExperimentConfig))


def test_cross_section_limits():
    with pytest.raises(ValueError, match=r"train\.eval_timesteps=2000 is invalid"):
        apply_overrides(ExperimentConfig(), ["eval_timesteps=2000"])
    # improved-diffusion stops at lr_anneal_steps: running past it trains at lr 0.
    with pytest.raises(ValueError, match=r"train\.max_steps=1000 .* optim\.lr_anneal_steps=100"):
        apply_overrides(ExperimentConfig(), ["lr_anneal_steps=100"])
    cfg = apply_overrides(ExperimentConfig(), ["lr_anneal_steps=100", "max_steps=100"])
    assert cfg.train.max_steps == cfg.optim.lr_anneal_steps == 100


def test_unknown_flags_get_suggestions_or_their_raydiff_equivalent():
    with pytest.raises(ValueError, match="did you mean noise_schedule"):
        apply_overrides(ExperimentConfig(), ["noise_schedul=cosine"])
    with pytest.raises(ValueError, match=r"raydiff train --resume PATH"):
        apply_overrides(ExperimentConfig(), ["resume_checkpoint=model.pt"])


def field_of(error: ConfigError) -> tuple[str, str]:
    return error.section, error.field


def test_errors_are_config_errors_naming_section_and_field():
    with pytest.raises(ConfigError) as info:
        ModelConfig(image_size=32, num_channels=48)
    assert field_of(info.value) == ("model", "num_channels") and info.value.value == 48
    with pytest.raises(ConfigError) as info:
        apply_overrides(ExperimentConfig(), ["learn_sigma=maybe"])
    assert field_of(info.value) == ("diffusion", "learn_sigma")
    assert info.value.reason == "expected True or False"
    # Derived data fields: the error names the source field, not data.channels.
    with pytest.raises(ConfigError) as info:
        apply_overrides(ExperimentConfig(), ["in_channels=2"])
    assert field_of(info.value) == ("model", "in_channels")
    with pytest.raises(ConfigError) as info:
        apply_overrides(ExperimentConfig(), ["use_fp16=True", "precision=bf16"])
    assert field_of(info.value) == ("model", "use_fp16")
    with pytest.raises(ConfigError) as info:
        apply_overrides(ExperimentConfig(), ["lr_anneal_steps=100"])
    assert field_of(info.value) == ("train", "max_steps")
    for lr in ("inf", "nan", "0"):  # an infinite lr would only show up as a diverged run
        with pytest.raises(ConfigError) as info:
            apply_overrides(ExperimentConfig(), [f"lr={lr}"])
        assert field_of(info.value) == ("optim", "lr")


def test_unknown_fields_are_user_input_errors_but_not_config_errors():
    for make in (
        lambda: apply_overrides(ExperimentConfig(), ["nosie_schedule=cosine"]),
        lambda: apply_overrides(ExperimentConfig(), ["model.nope=1"]),
        lambda: apply_overrides(ExperimentConfig(), ["no_equals_sign"]),
        lambda: from_dict(ExperimentConfig, {"modle": {}}),
    ):
        with pytest.raises(UserInputError) as info:
            make()
        assert not isinstance(info.value, ConfigError)


def test_a_config_file_that_is_not_yaml_is_named(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(UserInputError, match=r"bad\.yaml' is not valid YAML: ") as info:
        load_config(str(bad))
    assert "\n" not in str(info.value)


def test_image_size_that_cannot_be_downsampled_is_named_before_attention():
    # demo: channel_mult 1,2,2 (two downsamplings), attention at 8 px. 30 is not divisible by 4,
    # and 8 px is no resolution of a 30 px UNet; the cause is the image size.
    with pytest.raises(ConfigError) as info:
        load_config("demo", ["image_size=30"])
    assert field_of(info.value) == ("model", "image_size") and info.value.value == 30
    assert "divisible by 2^2" in str(info.value)
    assert str(info.value).startswith("model.image_size=30 is invalid: must be a positive multiple")


def test_architecture_errors_name_config_fields_not_unet_arguments():
    with pytest.raises(ConfigError, match=r"^model\.num_channels=48 is invalid: .*divisible by 32"):
        ModelConfig(image_size=32, num_channels=48)
    with pytest.raises(ConfigError) as info:  # attention in pixels, not downsample rates
        ModelConfig(image_size=32, attention_resolutions="16,5")
    assert str(info.value) == (
        "model.attention_resolutions='16,5' is invalid: 5 is not a resolution of this UNet; "
        "valid: [32, 16, 8, 4]"
    )
    with pytest.raises(ConfigError) as info:
        ModelConfig(image_size=32, attention_resolutions="0")
    assert field_of(info.value) == ("model", "attention_resolutions")
    with pytest.raises(ConfigError) as info:
        ModelConfig(image_size=32, num_head_channels=24)
    assert field_of(info.value) == ("model", "num_head_channels")
    with pytest.raises(ConfigError) as info:
        ModelConfig(image_size=32, num_heads=3)
    assert field_of(info.value) == ("model", "num_heads")
    with pytest.raises(ConfigError) as info:
        ModelConfig(image_size=32, num_heads_upsample=5)
    assert field_of(info.value) == ("model", "num_heads_upsample")
    # Heads need to divide the attention layers' channels only, as in the UNet itself: 64 channels
    # per head fit the 64-channel attention level and the 128-channel middle block, not level 1.
    config = ModelConfig(
        image_size=32,
        num_channels=64,
        channel_mult="1,1.5,2",
        attention_resolutions="32",
        num_head_channels=64,
    )
    assert config.attention_downsample_rates() == (1,)


def test_a_chain_needs_two_steps() -> None:
    """improved-diffusion's GaussianDiffusion cannot be built on one step (it indexes the
    posterior variance at 1): refused at the config, not as an IndexError mid-run."""
    for override, shown in [
        ("diffusion.diffusion_steps=1", r"diffusion\.diffusion_steps=1 is invalid: must be >= 2"),
        ("diffusion.timestep_respacing=1", r"timestep_respacing='1' is invalid: must keep >= 2"),
        ("train.sample_steps=1", r"train\.sample_steps=1 is invalid: must be >= 2"),
    ]:
        with pytest.raises(ConfigError, match=shown):
            apply_overrides(ExperimentConfig(), ["noise_schedule=cosine", override])
