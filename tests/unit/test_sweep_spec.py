"""Sweep files and results without Ray: every bad input is refused before a trial could start."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from raydiff.cli import main
from raydiff.config import load_config, to_dict
from raydiff.errors import UserInputError
from raydiff.results_table import Ranking
from raydiff.sweep.results import (
    TrialRow,
    best_row,
    format_table,
    trial_status,
    write_best_config,
    write_csv,
)
from raydiff.sweep.spec import load_sweep, trial_run_name, trial_seed

pytestmark = pytest.mark.unit

SPACE = {"noise_schedule": {"choice": ["linear", "cosine"]}, "lr": {"loguniform": [1e-4, 1e-3]}}


def sweep(**fields: object) -> dict:
    return {"base": "demo", "search_space": SPACE, **fields}


def test_fields_resolve_bare_or_dotted_and_trials_get_their_values_and_seeds():
    loaded = load_sweep(sweep(set={"max_steps": 20}), overrides=["batch_size=32"])
    assert [(d.key, d.field, d.kind) for d in loaded.dimensions] == [
        ("noise_schedule", "diffusion.noise_schedule", "choice"),
        ("lr", "optim.lr", "loguniform"),
    ]
    params = {"diffusion.noise_schedule": "linear", "optim.lr": 2.5e-4}
    first = loaded.trial_config(params, trial_number=0)
    second = loaded.trial_config(params, trial_number=1)
    assert first.diffusion.noise_schedule == "linear" and first.optim.lr == 2.5e-4
    assert first.train.max_steps == 20 and first.train.batch_size == 32
    assert first.train.seed == trial_seed(0, 0) != second.train.seed == trial_seed(0, 1)
    fixed = load_sweep(sweep(set={"seed": 7}))
    assert fixed.seed_is_fixed and fixed.trial_config(params, trial_number=3).train.seed == 7
    assert loaded.all_overrides() == {"max_steps": "20", "batch_size": "32"}


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ({"learning_rate": {"choice": [1e-4]}}, "unknown config field 'learning_rate'"),
        ({"lr": {"loguniform": [0, 1e-3]}}, "loguniform bounds must be > 0"),
        ({"lr": {"loguniform": [-1e-4, 1e-3]}}, "loguniform bounds must be > 0"),
        ({"lr": {"uniform": [1e-3, 1e-4]}}, "needs low < high"),
        ({"noise_schedule": {"choice": []}}, "an empty choice"),
        ({"noise_schedule": {"grid": []}}, "an empty grid"),
        ({"noise_schedule": {"choice": ["linear", "cosine", "sigmoid"]}}, "noise_schedule"),
        ({"noise_schedule": {"uniform": [0, 1]}}, "not a float field"),
        ({"num_res_blocks": {"randint": [1, 2.5]}}, "randint bounds must be integers"),
        ({"lr": {"randint": [1, 3]}}, "randint draws integers"),
        ({"lr": {"normal": [0, 1]}}, "expected one of"),
        ({"lr": [1e-4, 1e-3]}, "expected one of"),
        ({"batch_size": {"choice": [64, 33]}}, "batch_size=33"),
    ],
)
def test_bad_search_spaces_are_refused_naming_the_field(space, message):
    with pytest.raises(UserInputError, match=None) as error:
        load_sweep({"base": "demo", "search_space": space})
    assert message in str(error.value)
    assert next(iter(space)) in str(error.value)


def test_a_space_whose_trials_do_not_split_over_the_workers_is_refused():
    # 2 workers per trial (the demo's) and a batch of 33 in the space: that trial is invalid.
    with pytest.raises(UserInputError) as error:
        load_sweep(sweep(search_space={"batch_size": {"choice": [32, 33]}}))
    assert "with batch_size=33" in str(error.value) and "train.batch_size" in str(error.value)
    # The same space with 1 worker per trial is fine.
    load_sweep(
        sweep(search_space={"batch_size": {"choice": [32, 33]}}), overrides=["num_workers=1"]
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"set": {"lr": 1e-3}}, "also set for every trial"),
        ({"search": "optuna", "search_space": {"lr": {"grid": [1e-4, 1e-3]}}}, "Optuna"),
        ({"metric": "fid"}, "sweep.metric='fid'"),
        ({"mode": "lowest"}, "sweep.mode"),
        ({"num_samples": 0}, "sweep.num_samples=0"),
        ({"scheduler": {"name": "pbt"}}, "sweep.scheduler.name='pbt'"),
        ({"scheduler": {"reduction_factor": 1}}, "reduction_factor"),
        ({"scheduler": {"grace": 10}}, "sweep.scheduler: unknown key 'grace' (valid: name,"),
        ({"trials": 4}, "sweep: unknown key 'trials' (valid: base, set,"),
        ({"search_space": {}}, "at least one field"),
        ({"base": "no_such_preset"}, "no_such_preset"),
    ],
)
def test_bad_sweep_settings_are_refused(fields, message):
    with pytest.raises((UserInputError, FileNotFoundError)) as error:
        load_sweep(sweep(**fields))
    assert message in str(error.value)


def test_the_cli_refuses_a_bad_sweep_before_anything_is_created(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(sweep(search_space={"lr": {"loguniform": [0.0, 1e-3]}})))
    out = tmp_path / "out"
    assert main(["sweep", "--config", str(bad), "--output", str(out)]) == 1
    assert "loguniform bounds must be > 0" in capsys.readouterr().err
    assert not out.exists()
    assert main(["sweep", "--resume", str(tmp_path / "none")]) == 1
    assert "no sweep there" in capsys.readouterr().err


def test_trial_names_carry_their_values_in_safe_characters():
    name = trial_run_name(3, {"noise_schedule": "cosine", "optim.lr": 0.00123456, "x": "1,2 2"})
    assert name == "t0003_noise_schedule-cosine_lr-0.00123_x-1-2-2"


def _rows(tmp_path: Path) -> list[TrialRow]:
    run = tmp_path / "trials" / "t0001_lr-0.001"
    run.mkdir(parents=True)
    config = load_config("demo", ["lr=0.001", "seed=5"])
    (run / "config.json").write_text(json.dumps(to_dict(config)))
    return [
        TrialRow(trial="t0000_lr-0.0001", values={"lr": 1e-4}, seed=1, status="finished",
                 step=300, metrics={"val_bpd": 5.5, "loss": 0.07}),
        TrialRow(trial="t0001_lr-0.001", values={"lr": 1e-3}, seed=5, status="finished",
                 step=300, metrics={"val_bpd": 5.1, "loss": 0.06}, run_dir=str(run)),
        TrialRow(trial="t0002_lr-0.01", values={"lr": 1e-2}, seed=2,
                 status=trial_status(error=None, step=100, max_steps=300), step=100,
                 metrics={"val_bpd": 7.0}),
        TrialRow(trial="t0003_lr-0.1", values={"lr": 1e-1}, seed=3,
                 status=trial_status(error=RuntimeError("x\nFloatingPointError: loss scale collapsed"), step=None,
                                     max_steps=300), step=None),
    ]  # fmt: skip


def test_results_table_csv_and_best_config(tmp_path):
    rows = _rows(tmp_path)
    assert [r.status for r in rows][2:] == [
        "stopped early",
        "failed: FloatingPointError: loss scale collapsed",
    ]
    assert best_row(rows, Ranking(key="val_bpd", mode="min")) is rows[1]
    assert best_row(rows, Ranking(key="val_bpd", mode="max")) is rows[2]
    columns = ("val_bpd", "val_mse", "loss")
    table = format_table(rows, Ranking(key="val_bpd", mode="min"), columns=columns)
    lines = table.splitlines()
    # Columns some trial reported (no val_mse here), the objective always and first.
    assert lines[0].split() == ["trial", "lr", "val_bpd", "loss", "steps", "status"]
    header = format_table(rows, Ranking(key="val_acc@1", mode="max"), columns=columns)
    header = header.splitlines()[0].split()
    assert header == ["trial", "lr", "val_acc@1", "val_bpd", "loss", "steps", "status"]
    assert lines[3].startswith("t0001 *") and "5.1" in lines[3]
    assert lines[-1] == "* best val_bpd (min): t0001_lr-0.001"

    rows[0].metrics["lr"] = 2e-4  # the loop reports its lr: the swept lr keeps the column
    path = write_csv(rows, tmp_path / "results.csv", metric="val_bpd", columns=columns)
    with path.open() as f:
        assert next(csv.reader(f)).count("lr") == 1
    with path.open() as f:
        written = list(csv.DictReader(f))
    assert written[0]["lr"] == "0.0001"
    assert [r["trial"] for r in written] == [r.trial for r in rows]
    assert written[1]["lr"] == "0.001" and written[1]["val_bpd"] == "5.1"
    assert (
        written[3]["status"] == "failed: FloatingPointError: loss scale collapsed"
        and written[3]["val_bpd"] == ""
    )

    best = write_best_config(rows[1], tmp_path / "best_config.yaml", command="train")
    assert "raydiff train --config" in best.read_text()
    config = load_config(str(best))
    assert config.optim.lr == 0.001 and config.train.seed == 5


def test_a_classifier_config_is_a_sweep_base_with_its_own_metrics():
    space = {"lr": {"loguniform": [1e-4, 1e-3]}, "classifier_depth": {"choice": [1, 2]}}
    loaded = load_sweep(
        {
            "base": "classifier_demo",
            "search_space": space,
            "metric": "val_acc@1",
            "mode": "max",
        }
    )
    trial = loaded.trial_config(
        {"optim.lr": 3e-4, "classifier.classifier_depth": 2}, trial_number=0
    )
    assert trial.train.task == "classifier" and trial.classifier.classifier_depth == 2
    with pytest.raises(UserInputError, match=r"train\.task='classifier', which reports val_acc@1"):
        load_sweep({"base": "classifier_demo", "search_space": space, "metric": "val_bpd"})
    with pytest.raises(UserInputError, match=r"train\.task='diffusion', which reports val_bpd"):
        load_sweep(sweep(metric="val_acc@1", mode="max"))


def test_an_upsampler_config_is_a_sweep_base_over_its_own_fields():
    space = {"lr": {"loguniform": [1e-4, 1e-3]}, "small_size": {"choice": [4, 8]}}
    loaded = load_sweep({"base": "upsampler_demo", "search_space": space})  # val_bpd, min
    trial = loaded.trial_config({"optim.lr": 3e-4, "super_res.small_size": 4}, trial_number=0)
    assert trial.train.task == "super_res" and trial.super_res.small_size == 4
    with pytest.raises(UserInputError, match=r"train\.task='super_res', which reports val_bpd"):
        load_sweep({"base": "upsampler_demo", "search_space": space, "metric": "val_acc@1"})


def test_every_task_has_its_sweep_objectives():
    from typing import get_args

    from raydiff.config.train import TaskName
    from raydiff.train.tasks import task_specs

    assert set(task_specs()) == set(get_args(TaskName))
    assert all(spec.objectives for spec in task_specs().values())


def test_a_sweep_without_metric_or_mode_takes_its_tasks_objective():
    space = {"lr": {"loguniform": [1e-4, 1e-3]}}
    diffusion = load_sweep({"base": "demo", "search_space": space})
    assert (diffusion.sweep.metric, diffusion.sweep.mode) == ("val_bpd", "min")
    classifier = load_sweep({"base": "classifier_demo", "search_space": space})
    assert (classifier.sweep.metric, classifier.sweep.mode) == ("val_acc@1", "max")
    loss = load_sweep({"base": "classifier_demo", "search_space": space, "metric": "val_loss"})
    assert (loss.sweep.metric, loss.sweep.mode) == ("val_loss", "min")
    given = load_sweep({"base": "demo", "search_space": space, "mode": "max"})
    assert given.sweep.mode == "max"
