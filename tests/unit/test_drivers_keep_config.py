"""The drivers (``run_training_job``, ``start_sweep``) derive the run's config (a dataset path
made absolute, for workers and trials that run in other folders) without changing the config
their caller passed: the caller may reuse it, and a config is a value."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest

from raydiff.config import ExperimentConfig, apply_overrides
from raydiff.orchestrate.training_job import run_training_job, with_absolute_data_dir

pytestmark = pytest.mark.unit

MISSING = "no-such-dataset"
"""A relative dataset path with no dataset: each driver stops there, before Ray starts."""


def test_the_run_config_has_an_absolute_data_dir_and_the_callers_is_unchanged(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    config = apply_overrides(ExperimentConfig(), [f"data.data_dir={MISSING}"])
    run_config = with_absolute_data_dir(config)
    assert run_config.data.data_dir == str(tmp_path.resolve() / MISSING)
    assert config.data.data_dir == MISSING
    assert run_config.model == config.model and run_config.train == config.train
    uri = apply_overrides(config, ["data.data_dir=s3://bucket/data"])
    assert with_absolute_data_dir(uri) == uri  # a URI stays as given


def test_the_training_driver_leaves_the_callers_config_unchanged(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = apply_overrides(ExperimentConfig(), [f"data.data_dir={MISSING}"])
    before = copy.deepcopy(config)
    with pytest.raises(FileNotFoundError, match=str(tmp_path.resolve() / MISSING)):
        run_training_job(config, output_dir=tmp_path / "run")
    assert config == before and config.data.data_dir == MISSING


def test_the_sweep_driver_leaves_the_callers_sweep_and_config_unchanged(tmp_path, monkeypatch):
    from raydiff.orchestrate.sweep import start_sweep
    from raydiff.sweep.spec import load_sweep

    monkeypatch.chdir(tmp_path)
    loaded = load_sweep(
        {
            "base": "demo",
            "set": {"data.data_dir": MISSING},
            "search_space": {"lr": {"choice": [1e-4]}},
        }
    )
    before = copy.deepcopy(loaded)
    with pytest.raises(FileNotFoundError, match=str(Path(tmp_path.resolve() / MISSING))):
        start_sweep(loaded, output_dir=tmp_path / "sweep")
    assert loaded == before and loaded.base_config.data.data_dir == MISSING


def test_every_section_and_the_experiment_config_are_frozen():
    config = ExperimentConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.train = config.train  # type: ignore[misc]
    for section in dataclasses.fields(config):
        value = getattr(config, section.name)
        name = dataclasses.fields(value)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError, match=name):
            setattr(value, name, getattr(value, name))
