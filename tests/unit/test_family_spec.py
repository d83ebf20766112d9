"""Family files (``raydiff family``): what a file builds, and the files refused before anything
starts, each in one line naming the stage and the field. No Ray, no data read: the datasets are
declared and not prepared yet."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from raydiff.errors import UserInputError
from raydiff.family.spec import load_family


def family_file(tmp_path: Path, **changes: object) -> Path:
    """A small valid family (8x8 base, its classifier, an 8 -> 16 upsampler, a 16x16 evaluator)
    with ``changes`` merged into its blocks (None removes a block)."""
    small, large = str(tmp_path / "data8"), str(tmp_path / "data16")
    tiny = {"in_channels": 1, "num_channels": 32, "channel_mult": "1,2", "num_res_blocks": 1}
    tiny |= {"attention_resolutions": ""}
    blocks: dict[str, object] = {
        "datasets": {
            small: {"source": "fashion-mnist", "image_size": 8},
            large: {"source": "fashion-mnist", "image_size": 16},
        },
        "base": {"config": "demo", "set": {**tiny, "image_size": 8, "data_dir": small}},
        "classifier": {
            "config": "classifier_demo",
            "set": {**tiny, "image_size": 8, "data_dir": small},
            "resources": {"num_workers": 1},
        },
        "upsampler": {
            "config": "upsampler_demo",
            "set": {**tiny, "image_size": 16, "small_size": 8, "data_dir": large},
        },
        "evaluator": {
            "config": "evaluator_demo",
            "set": {**tiny, "image_size": 16, "data_dir": large},
        },
        "sample": {"num_samples": 16},
    }
    for key, value in changes.items():
        if value is None:
            blocks.pop(key)
        elif isinstance(value, dict) and isinstance(blocks.get(key), dict):
            merged = dict(blocks[key])  # type: ignore[arg-type]
            for name, item in value.items():
                merged[name] = {**merged.get(name, {}), **item} if isinstance(item, dict) else item
            blocks[key] = merged
        else:
            blocks[key] = value
    path = tmp_path / "family.yaml"
    path.write_text(yaml.safe_dump(blocks))
    return path


def test_a_family_file_builds_each_stage_as_its_command_would(tmp_path: Path) -> None:
    family = load_family(str(family_file(tmp_path)), overrides=["base.lr=5e-4"], max_steps=20)
    assert list(family.stages) == ["base", "classifier", "upsampler", "evaluator"]
    assert len(family.waiting_for_data) == 2 and family.final_size == 16
    base, classifier = family.stages["base"], family.stages["classifier"]
    assert base.command == "train" and classifier.command == "train-classifier"
    assert base.config.optim.lr == 5e-4 and base.config.model.image_size == 8
    assert all(s.config.train.max_steps == 20 for s in family.stages.values())
    assert classifier.config.scaling.num_workers == 1
    argv = base.argv(output="out/base", address="10.0.0.1:6379")
    assert argv[:3] == ["train", "--config", "demo"] and "lr=5e-4" in argv
    assert argv[-4:] == ["--output", "out/base", "--address", "10.0.0.1:6379"]
    assert family.sample.num_samples == 16 and family.evaluate.split == "test"


def test_the_shipped_demo_family_loads_by_name() -> None:
    family = load_family("family_demo", max_steps=5)
    assert family.final_size == 32 and family.stages["base"].config.model.image_size == 8
    assert {s.config.train.max_steps for s in family.stages.values()} == {5}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"base": None}, "stage base: missing: a family needs a diffusion model"),
        ({"evaluator": None}, "stage evaluator: missing: a family needs a clean classifier"),
        (
            {"classifier": None, "sample": {"classifier_scale": 2.0}},
            "stage sample: classifier_scale=2.0 is invalid: no classifier stage",
        ),
        (
            {"classifier": {"set": {"diffusion_steps": 500}}},
            "stage classifier: diffusion.diffusion_steps=500 is invalid: it guides the base",
        ),
        (
            {"classifier": {"set": {"noise_schedule": "linear"}}},
            "stage classifier: diffusion.noise_schedule='linear' is invalid",
        ),
        (
            {
                "base": {"set": {"class_cond": True, "num_classes": 10}},
                "classifier": {"set": {"num_classes": 5}},
            },
            "stage classifier: model.num_classes=5 is invalid: it guides the base model, whose "
            "is 10",
        ),
        (
            {"upsampler": {"set": {"small_size": 4}}},
            "stage upsampler: super_res.small_size=4 is invalid: it upsamples the base model's "
            "samples, which are 8x8",
        ),
        (
            {"evaluator": {"set": {"image_size": 8}}},
            "stage evaluator: model.image_size=8 is invalid: it judges the family's final images",
        ),
        (
            {"evaluator": {"set": {"noised": True}}},
            "stage evaluator: train.task='classifier' is invalid: the evaluator stage trains a "
            "clean classifier",
        ),
        ({"upsampler": {"config": "demo"}}, "stage upsampler: train.task='diffusion'"),
        ({"base": {"set": {"data_dir": "/nowhere/data"}}}, "stage base: data.data_dir="),
        ({"base": {"set": {"lr": "fast"}}}, "stage base: optim.lr"),
        ({"base": {"config": "nosuch"}}, "stage base: config file 'nosuch' does not exist"),
        ({"base": {"size": 1}}, "stage base: unknown key 'size' (valid: config, set, resources)"),
        (
            {"base": {"resources": {"gpus": 1}}},
            "stage base: resources: unknown key 'gpus' (valid: num_workers,",
        ),
        ({"sample": {"steps": 3}}, "stage sample: unknown key 'steps' (valid: num_samples,"),
        ({"sample": {"num_samples": 0}}, "stage sample: num_samples=0 is invalid: must be >= 1"),
        ({"upscaler": {}}, "family file: unknown key 'upscaler' (valid: datasets, tracking, base,"),
        (
            {"sample": {"weights": "phema_0.080"}},
            "stage sample: weights='phema_0.080' is invalid: the base stage tracks no post-hoc "
            "EMA: set its optim.posthoc_ema_stds",
        ),
        (
            {"sample": {"weights": "ema_0.5"}},
            "stage sample: weights='ema_0.5' is invalid: the base stage keeps ema_0.99",
        ),
        (
            {"upsampler": None, "sample": {"upsampler_weights": "ema_0.99"}},
            "stage sample: upsampler_weights='ema_0.99' is invalid: the family has no upsampler",
        ),
        ({"datasets": {"d": {"sorce": "x"}}}, "datasets: d: "),
        ({"tracking": {"server": "x"}}, "stage tracking: unknown key 'server' (valid: backend,"),
    ],
)
def test_a_bad_family_file_is_refused_naming_the_stage_and_field(
    tmp_path: Path, changes: dict, message: str
) -> None:
    with pytest.raises(UserInputError, match=re.escape(message)):
        load_family(str(family_file(tmp_path, **changes)))


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("lr=1e-3", "--set lr=1e-3: expected STAGE.FIELD=VALUE"),
        ("decoder.lr=1e-3", "--set decoder.lr=1e-3: expected STAGE.FIELD=VALUE"),
        ("base.lr", "--set base.lr: expected STAGE.FIELD=VALUE"),
    ],
)
def test_a_bad_stage_override_is_refused(tmp_path: Path, item: str, message: str) -> None:
    with pytest.raises(UserInputError, match=re.escape(message)):
        load_family(str(family_file(tmp_path)), overrides=[item])


def test_sample_and_evaluate_options_are_overridden_too(tmp_path: Path) -> None:
    family = load_family(
        str(family_file(tmp_path)),
        overrides=["sample.num_samples=8", "sample.use_ddim=false", "evaluate.split=val"],
    )
    assert family.sample.num_samples == 8 and family.sample.use_ddim is False
    assert family.evaluate.split == "val"


def test_an_unknown_family_name_lists_the_shipped_ones() -> None:
    with pytest.raises(FileNotFoundError, match="shipped family files by name: family_demo"):
        load_family("family_nosuch")


def test_post_hoc_ema_weights_of_a_tracking_stage_are_taken(tmp_path: Path) -> None:
    file = family_file(
        tmp_path,
        base={"set": {"posthoc_ema_stds": "0.05,0.10"}},
        sample={"weights": "phema_0.080"},
    )
    assert load_family(str(file)).sample.weights == "phema_0.080"


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_the_sample_stage_reconstructs_the_post_hoc_lengths_it_samples_with(
    tmp_path: Path, where: str
) -> None:
    """Its command lines: ``raydiff ema`` for a ``phema_`` weights the checkpoint lacks, then
    the guided and the unguided cascade; samples already written are not drawn again. The same
    for a family in a bucket (a mock:// URI here): what is done is read there."""
    from raydiff.orchestrate.family import sample_commands
    from raydiff.storage import as_location

    file = family_file(
        tmp_path,
        base={"set": {"posthoc_ema_stds": "0.05,0.10"}},
        sample={"weights": "phema_0.080"},
    )
    family = load_family(str(file))
    out = tmp_path / "family" if where == "local" else as_location("mock:///bucket/family")
    for stage in ("base", "classifier", "upsampler"):
        (out / stage / "checkpoint_000450").mkdir(parents=True)
        (out / stage / "checkpoint_000450" / "files.json").write_text("{}")
    commands = sample_commands(family, out=out, address="auto")
    assert commands[0] == [
        "ema", "--run", str(out / "base"), "--sigma-rel", "0.080", "--step", "450"
    ]  # fmt: skip
    guided, unguided = commands[1:]
    assert guided[guided.index("--out") + 1] == str(out / "sample" / "guided")
    assert "--classifier" in guided and "--classifier" not in unguided
    assert guided[guided.index("--weights") + 1] == "phema_0.080"
    (out / "base" / "checkpoint_000450" / "phema_0.080.pt").write_bytes(b"")
    (out / "sample" / "guided" / "upsampled").mkdir(parents=True)
    (out / "sample" / "guided" / "upsampled" / "samples_16x16x16x1.npz").write_bytes(b"")
    assert [c[c.index("--out") + 1] for c in sample_commands(family, out=out, address="a")] == [
        str(out / "sample" / "unguided")
    ]


def test_the_tracking_block_is_every_stage_s(tmp_path: Path) -> None:
    file = family_file(tmp_path, tracking={"backend": "tensorboard"})
    family = load_family(str(file), overrides=["tracking.wandb_project=fam"])
    assert {s.config.tracking.wandb_project for s in family.stages.values()} == {"fam"}
    assert all(s.overrides[0] == "tracking.backend=tensorboard" for s in family.stages.values())


def test_a_refused_family_leaves_no_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from raydiff.cli import main

    file = family_file(tmp_path, upsampler={"set": {"small_size": 4}})
    assert main(["family", str(file), "--output", str(tmp_path / "out")]) == 1
    assert "stage upsampler: super_res.small_size=4 is invalid" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_stage_that_sets_channels_unlike_its_data_is_refused_before_anything_starts(
    tmp_path: Path, tiny_prepared: Path
) -> None:
    """A stage's config is built as ``raydiff train`` builds it: ``in_channels`` set by the
    stage's ``set`` is kept, so greyscale data refuses an RGB model here, not when the stage's
    own training starts (a preset's channels follow the data, as for ``raydiff train``)."""
    data = {"data_dir": str(tiny_prepared), "image_size": 8}
    classifier = {"set": {**data, "num_classes": 3}}
    follows = load_family(str(family_file(tmp_path, classifier=classifier)))
    assert follows.stages["classifier"].config.model.in_channels == 1
    rgb = {"set": {**data, "num_classes": 3, "in_channels": 3}}
    message = "stage classifier: model.in_channels=3 is invalid: the dataset"
    with pytest.raises(UserInputError, match=re.escape(message)):
        load_family(str(family_file(tmp_path, classifier=rgb)))
