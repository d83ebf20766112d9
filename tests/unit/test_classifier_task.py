"""The noisy-classifier task (``train.task=classifier``): its terms, crop, validation and config."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from tiny_model import tiny_classifier

from raydiff.config import ExperimentConfig, apply_overrides
from raydiff.errors import ConfigError
from raydiff.train.tasks import task_of_config
from raydiff.train.tasks.classifier import (
    ClassifierTask,
    classification_terms,
    random_resized_crop,
)
from raydiff.train.tasks.diffusion import DiffusionTask


def classifier_config(*overrides: str) -> ExperimentConfig:
    return apply_overrides(
        ExperimentConfig(),
        [*tiny_classifier(image_size=16), "diffusion.diffusion_steps=40", *overrides],
    )


def test_terms_are_cross_entropy_and_top_k_hits() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0, -2.0], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]])
    labels = torch.tensor([0, 0])
    terms = classification_terms(logits, labels)
    expected = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    assert torch.allclose(terms["loss"], expected)
    assert terms["acc@1"].tolist() == [1.0, 0.0]
    assert terms["acc@5"].tolist() == [1.0, 0.0]  # class 0 is the 6th best of the second row
    three_classes = classification_terms(torch.randn(4, 3), torch.tensor([0, 1, 2, 0]))
    assert three_classes["acc@5"].tolist() == [1.0] * 4  # top-5 of 3 classes always hits


def test_random_crop_keeps_size_and_range_and_varies() -> None:
    torch.manual_seed(0)
    x = torch.rand(16, 1, 16, 16) * 2 - 1
    seeds = list(range(100, 116))
    out = random_resized_crop(x, seeds=seeds)
    assert out.shape == x.shape and out.min() >= -1 and out.max() <= 1
    changed = [not torch.equal(a, b) for a, b in zip(out, x, strict=True)]
    assert any(changed) and not all(changed)  # zoom 1 (side 16) is one of the 5 sides 16..20
    assert torch.equal(random_resized_crop(x, seeds=seeds, max_zoom=1.0), x)
    assert math.ceil(16 * 1.25) == 20


def test_a_rows_crop_depends_on_its_seed_only() -> None:
    """The same row and seed give the same crop in any batch (the trainer keys each row's seed
    by its place in the global batch: crops do not depend on the worker count)."""
    x = torch.rand(8, 1, 16, 16) * 2 - 1
    seeds = list(range(8))
    whole = random_resized_crop(x, seeds=seeds)
    parts = [random_resized_crop(x[i : i + 3], seeds=seeds[i : i + 3]) for i in (0, 3, 6)]
    assert torch.equal(torch.cat(parts), whole)
    assert not torch.equal(random_resized_crop(x, seeds=list(range(50, 58))), whole)
    with pytest.raises(ValueError, match="7 seeds for 8 images"):
        random_resized_crop(x, seeds=seeds[:7])


def test_the_config_chooses_the_task() -> None:
    assert isinstance(task_of_config(classifier_config(), runtime=None), ClassifierTask)
    diffusion = apply_overrides(ExperimentConfig(), ["model.image_size=32"])
    assert isinstance(task_of_config(diffusion, runtime=None), DiffusionTask)


def test_clean_classifier_sees_t_zero_and_evaluation_counts_add_up() -> None:
    config = classifier_config("classifier.noised=false", "classifier.random_crop=false")
    torch.manual_seed(0)
    task = ClassifierTask.from_config(config)
    seen = []
    model = task.model
    model.register_forward_hook(lambda _m, args, _out: seen.append(args[1].clone()))
    batch = {"x": torch.rand(4, 1, 16, 16) * 2 - 1, "y": torch.tensor([0, 1, 2, 3])}
    terms = task.losses(model, batch, torch.tensor([5, 10, 20, 39]))
    assert set(terms) == {"loss", "acc@1", "acc@5"} and terms["loss"].shape == (4,)
    assert seen[-1].tolist() == [0, 0, 0, 0]

    noisy = ClassifierTask.from_config(classifier_config())
    val = [(batch["x"], {"y": batch["y"]}), (batch["x"][:2], {"y": batch["y"][:2]})]
    with torch.no_grad():
        totals = noisy.evaluate(noisy.model.eval(), val, seed=1)
        again = noisy.evaluate(noisy.model, val, seed=1)
    assert float(totals["count"]) == 6
    assert sum(float(totals[f"count_q{q}"]) for q in range(4)) == 6
    assert all(torch.equal(totals[k], again[k]) for k in totals)  # the same draw every time
    metrics = noisy.evaluation_metrics(totals)
    assert {"val_loss", "val_acc@1", "val_acc@5", "val_acc@1_t0"} <= set(metrics)
    assert 0 <= metrics["val_acc@1"] <= metrics["val_acc@5"] <= 1


@pytest.mark.parametrize("noised", ["true", "false"])
def test_evaluating_no_images_gives_every_total_zero(noised: str) -> None:
    """A rank without val images (fewer images than workers) sums the same keys as a rank
    with some: the all-reduce packs the keys of every rank alike."""
    torch.manual_seed(0)
    task = ClassifierTask.from_config(classifier_config(f"classifier.noised={noised}"))
    val = [(torch.rand(3, 1, 16, 16) * 2 - 1, {"y": torch.tensor([0, 1, 2])})]
    with torch.no_grad():
        some = task.evaluate(task.model.eval(), val, seed=1)
        none = task.evaluate(task.model, [], seed=1)
    assert sorted(none) == sorted(some) == sorted(task.total_names())
    assert all(float(v) == 0 for v in none.values())
    assert float(some["count"]) == 3
    summed = {k: some[k] + none[k] for k in some}  # what two ranks' totals sum to
    assert task.evaluation_metrics(summed) == task.evaluation_metrics(some)


def test_classifier_config_derivation_and_refusals() -> None:
    config = classifier_config()
    # It trains on labels: the model section's class_cond (and the data's) follow the task.
    assert config.model.class_cond and config.data.class_cond
    with pytest.raises(ConfigError, match=r"model\.class_cond=False .* set model\.class_cond"):
        dataclasses.replace(config, model=dataclasses.replace(config.model, class_cond=False))
    with pytest.raises(ConfigError, match=r"classifier_channel_mult='' .* image_size 16"):
        classifier_config("classifier.classifier_channel_mult=")
    with pytest.raises(ConfigError, match=r"classifier_attention_resolutions='5' .* 5 does not"):
        classifier_config("classifier.classifier_attention_resolutions=5")
    with pytest.raises(ConfigError, match=r"classifier_pool='max' .* valid: adaptive"):
        classifier_config("classifier.classifier_pool=max")
    with pytest.raises(ConfigError, match=r"every_checkpoint=True .* classifier"):
        classifier_config("evaluation.every_checkpoint=true")
    with pytest.raises(ConfigError, match=r"train\.task='gan' .* valid: diffusion, classifier"):
        classifier_config("train.task=gan")
    assert classifier_config("classifier_use_fp16=true").train.precision == "fp16"
    # Published sizes take guided-diffusion's multipliers.
    published = apply_overrides(
        ExperimentConfig(), ["train.task=classifier", "model.image_size=64"]
    )
    assert published.classifier.channel_mult(64) == (1, 2, 3, 4)


def test_classifier_architecture_errors_name_classifier_fields() -> None:
    with pytest.raises(ConfigError, match=r"classifier\.classifier_width=48 is invalid: .*Group"):
        classifier_config("classifier.classifier_width=48")


def test_train_classifier_refuses_a_config_of_another_task(tmp_path, capsys) -> None:
    from raydiff.cli import main

    out = tmp_path / "run"
    assert main(["train-classifier", "--config", "demo", "--output", str(out)]) == 1
    error = capsys.readouterr().err.strip()
    assert error == (
        "raydiff train-classifier: error: --config demo trains train.task='diffusion', not "
        "'classifier': give a classifier config (or --set train.task=classifier)"
    )
    assert not out.exists()


def test_the_start_up_line_names_the_classifiers_objective(caplog, tmp_path):
    from raydiff.train.build import build_rank_optimizer
    from raydiff.train.local import LocalRuntime
    from raydiff.train.tasks import task_of_config

    config = classifier_config()
    size = config.model.image_size
    runtime = LocalRuntime(
        config,
        output_dir=tmp_path,
        resume=None,
        images=torch.zeros(4, config.model.in_channels, size, size),
        labels=torch.zeros(4, dtype=torch.int64),
    )
    with caplog.at_level("INFO", logger="raydiff.train.build"):
        build_rank_optimizer(config, runtime=runtime, make_task=task_of_config)
    [line] = [r.getMessage() for r in caplog.records if "parameters" in r.getMessage()]
    assert line.startswith("classifier: ") and "cross-entropy of x_t" in line
