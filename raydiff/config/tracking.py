"""The tracking section: where a run's parameters, metrics and images are recorded."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Literal, get_args

from raydiff.config.field_values import invalid

TrackingBackend = Literal["tensorboard", "mlflow", "wandb"]
WandbMode = Literal["auto", "online", "offline"]

EXTRA_OF_BACKEND: dict[str, str] = {"mlflow": "mlflow", "wandb": "wandb"}
"""The module each backend imports, which is also the name of raydiff's extra that installs it
(``pip install 'raydiff[mlflow]'``); TensorBoard is a dependency of raydiff itself."""


@dataclass(kw_only=True, frozen=True)
class TrackingConfig:
    """The experiment trackers a run logs to: its config as parameters, every training and
    validation metric at its step, the preview grids and checkpoint evaluations, and the
    checkpoint locations (docs/tracking.md). One tracked run per run folder, continued by a
    resumed or restarted run; a sweep is a parent run with one child per trial."""

    backend: str = "tensorboard"
    """Comma-separated trackers: 'tensorboard', 'mlflow', 'wandb' (e.g. 'tensorboard,mlflow')."""
    mlflow_tracking_uri: str = ""
    """MLflow's tracking server or store ('': MLFLOW_TRACKING_URI, else MLflow's default)."""
    mlflow_experiment: str = "raydiff"
    """The MLflow experiment the runs go to (created if missing)."""
    wandb_project: str = "raydiff"
    """The W&B project."""
    wandb_entity: str = ""
    """The W&B entity (team or user; '': the account's default)."""
    wandb_mode: WandbMode = "auto"
    """'online', 'offline' (files in the run folder's wandb/, for `wandb sync`), or 'auto':
    online when WANDB_API_KEY is set, else offline."""

    def __post_init__(self) -> None:
        names = [name.strip() for name in self.backend.split(",")]
        valid = get_args(TrackingBackend)
        for name in names:
            if name not in valid:
                raise invalid(
                    "tracking",
                    "backend",
                    self.backend,
                    f"{name!r} is not a tracker; expected comma-separated names of "
                    f"{', '.join(valid)} (e.g. 'tensorboard,mlflow')",
                )
        if len(set(names)) != len(names):
            raise invalid("tracking", "backend", self.backend, "names a tracker twice")
        if not self.mlflow_experiment.strip():
            raise invalid("tracking", "mlflow_experiment", self.mlflow_experiment, "is empty")
        if not self.wandb_project.strip():
            raise invalid("tracking", "wandb_project", self.wandb_project, "is empty")

    @property
    def backends(self) -> tuple[str, ...]:
        """The trackers, in the order given."""
        return tuple(name.strip() for name in self.backend.split(","))

    def check_installed(self) -> None:
        """Refuse a tracker whose package is not installed, naming the extra that installs it
        (run before anything starts: a worker must not find out)."""
        for name in self.backends:
            module = EXTRA_OF_BACKEND.get(name)
            if module is not None and importlib.util.find_spec(module) is None:
                raise invalid(
                    "tracking",
                    "backend",
                    self.backend,
                    f"{name} is not installed: pip install 'raydiff[{module}]'",
                )
