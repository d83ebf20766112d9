"""The tracking section's checks, the refusal of a tracker that is not installed, and the rule
that logs each step once (raydiff.tracking). The backends against a real MLflow server
and W&B's offline files: tests/integration/test_tracking.py."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

import numpy as np
import pytest

from raydiff.config import ExperimentConfig, TrackingConfig, apply_overrides
from raydiff.errors import ConfigError
from raydiff.tracking import Point, Trackers
from raydiff.train.preflight import check_run

pytestmark = pytest.mark.unit


def test_backends_are_a_comma_separated_list_tensorboard_by_default() -> None:
    assert TrackingConfig().backends == ("tensorboard",)
    assert TrackingConfig(backend="tensorboard, mlflow").backends == ("tensorboard", "mlflow")
    config = apply_overrides(ExperimentConfig(), ["tracking.backend=mlflow,wandb"])
    assert config.tracking.backends == ("mlflow", "wandb")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"backend": "mlfow"}, "'mlfow' is not a tracker; expected comma-separated names of "),
        ({"backend": "mlflow,mlflow"}, "names a tracker twice"),
        ({"backend": ""}, "'' is not a tracker"),
        ({"mlflow_experiment": " "}, "is empty"),
        ({"wandb_project": ""}, "is empty"),
    ],
)
def test_a_bad_value_is_refused_naming_the_field(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match="tracking") as caught:
        TrackingConfig(**fields)
    assert message in str(caught.value)


def test_wandb_mode_takes_only_its_choices() -> None:
    with pytest.raises(ConfigError, match="wandb_mode"):
        apply_overrides(ExperimentConfig(), ["tracking.wandb_mode=sometimes"])


@pytest.mark.parametrize("backend", ["mlflow", "wandb"])
def test_a_tracker_that_is_not_installed_is_refused_before_the_run_naming_its_extra(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == backend else find_spec(name, *args),
    )
    config = apply_overrides(ExperimentConfig(), [f"tracking.backend=tensorboard,{backend}"])
    # The preflight every run goes through (Ray, --single-process, each sweep trial) refuses
    # it first, before it reads the dataset.
    with pytest.raises(ConfigError) as caught:
        check_run(config, manifest=None)  # type: ignore[arg-type]
    assert f"{backend} is not installed: pip install 'raydiff[{backend}]'" in str(caught.value)
    assert "tracking.backend" in str(caught.value)
    TrackingConfig(backend="tensorboard").check_installed()  # TensorBoard needs no extra


class Recorder:
    """A tracker that records what reaches it; its run held steps up to ``logged_through``."""

    where = "recorder"

    def __init__(self, logged_through: int) -> None:
        self.logged_through = logged_through
        self.steps: list[int] = []
        self.images: list[int] = []
        self.histograms: list[int] = []
        self.checkpoints: list[int] = []

    def log_scalars(self, points: Sequence[Point]) -> None:
        self.steps += [p.step for p in points]

    def log_image(self, key: str, image: np.ndarray, *, step: int) -> None:
        self.images.append(step)

    def log_histogram(self, key: str, values: np.ndarray, *, step: int) -> None:
        self.histograms.append(step)

    def log_checkpoint(self, location: str, *, step: int) -> None:
        self.checkpoints.append(step)

    def flush(self, *, now: bool) -> None:
        pass

    def close(self) -> None:
        pass


def test_steps_a_restart_trains_again_are_logged_once() -> None:
    """The first attempt logged steps 1-6 and checkpointed at 4; the restarted group trains 5-9
    again: its 5 and 6 are dropped, so the run holds every step once (the first values)."""
    fresh, resumed = Recorder(logged_through=-1), Recorder(logged_through=6)
    trackers = Trackers([fresh, resumed])
    grid = np.zeros((4, 4, 1), np.uint8)
    for step in range(5, 10):
        trackers.log_image("samples/ema", grid, step=step)
        trackers.log_histogram("sampler/weights", np.ones(3), step=step)
        trackers.log_scalars([Point(step, {"loss_step": 0.1}), Point(step, {"loss": 0.1})])
        trackers.log_checkpoint(f"run/checkpoint_{step:06d}", step=step)
    assert fresh.steps == [5, 5, 6, 6, 7, 7, 8, 8, 9, 9]
    assert resumed.steps == [7, 7, 8, 8, 9, 9]
    assert resumed.images == resumed.histograms == [7, 8, 9]
    assert resumed.checkpoints == [5, 6, 7, 8, 9]  # where they are: always said
