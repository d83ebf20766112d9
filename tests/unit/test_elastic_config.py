"""``scaling.num_workers`` as a range (an elastic run): how it is written, and the refusals
before anything starts."""

from __future__ import annotations

import json
import re

import pytest

from raydiff.config import ExperimentConfig, apply_overrides, from_dict, load_config, to_dict
from raydiff.config.scaling import ScalingConfig
from raydiff.config.train import TrainConfig
from raydiff.errors import ConfigError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "value,expected",
    [(2, 2), ("2", 2), ("1-4", (1, 4)), ([1, 4], (1, 4)), ("[1, 4]", (1, 4)), ("3-3", 3)],
)
def test_a_count_or_a_range_in_every_spelling(value, expected):
    scaling = ScalingConfig(num_workers=value)
    assert scaling.num_workers == expected
    low, high = expected if isinstance(expected, tuple) else (expected, expected)
    assert (scaling.min_workers, scaling.max_workers) == (low, high)
    assert list(scaling.worker_sizes) == list(range(low, high + 1))


@pytest.mark.parametrize(
    "value,reason",
    [
        ("4-2", "the minimum 4 is above the maximum 2"),
        ("0-2", "must be >= 1"),
        (0, "must be >= 1"),
        ("x", "expected N or MIN-MAX"),
        ([1, 2, 3], "expected N or MIN-MAX"),
        (2.5, "expected N or MIN-MAX"),
    ],
)
def test_bad_counts_are_refused_naming_the_field(value, reason):
    with pytest.raises(ConfigError, match=rf"scaling\.num_workers=.* {reason}"):
        ScalingConfig(num_workers=value)


def test_a_range_survives_set_yaml_and_json():
    config = apply_overrides(load_config("demo"), ["num_workers=1-4", "batch_size=36"])
    assert config.scaling.num_workers == (1, 4)
    again = from_dict(ExperimentConfig, json.loads(json.dumps(to_dict(config))))
    assert again.scaling.num_workers == (1, 4)
    assert apply_overrides(config, ["scaling.num_workers=2"]).scaling.num_workers == 2


def test_the_batch_must_split_over_every_size_of_the_range():
    TrainConfig(batch_size=24).check_worker_sizes(range(2, 5))  # 2, 3 and 4 divide 24
    TrainConfig(batch_size=32).check_worker_sizes(range(2, 3))
    with pytest.raises(ConfigError, match=r"1-4: 3 workers cannot take it; batch_size=36 splits"):
        TrainConfig(batch_size=32).check_worker_sizes(range(1, 5))
    # Each worker's batch must also split into microbatches: 48 is 4 x 12 for every size.
    with pytest.raises(ConfigError, match=r"microbatch=4: 4 workers .* batch_size=48"):
        TrainConfig(batch_size=24, microbatch=4).check_worker_sizes(range(2, 5))
    with pytest.raises(ConfigError, match="divisible by the number of workers"):
        TrainConfig(batch_size=32).check_worker_sizes(range(3, 4))  # one size: the usual message


def test_the_train_command_refuses_a_range_the_batch_cannot_follow(tmp_path, capsys):
    from raydiff.cli import main

    code = main(["train", "--config", "demo", "--num-workers", "2-3", "--output", str(tmp_path)])
    assert code != 0
    err = capsys.readouterr().err
    assert "2-3: 3 workers cannot take it; batch_size=36" in err
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("max_preemption_failures", -2, "must be >= 0, or -1 for unlimited"),
        ("preemption_check_interval", -1, "must be >= 0 (0: never)"),
        ("resize_check_interval_s", -0.5, "must be >= 0"),
    ],
)
def test_bad_preemption_and_resize_settings_are_refused(field, value, reason):
    with pytest.raises(ConfigError, match=rf"scaling\.{field}.*{re.escape(reason)}"):
        ScalingConfig(**{field: value})
    # The defaults: unlimited preemptions, a check after every step, Ray's 60 s resize check.
    scaling = ScalingConfig()
    assert (scaling.max_preemption_failures, scaling.preemption_check_interval) == (-1, 1)
    assert scaling.resize_check_interval_s == 60.0
