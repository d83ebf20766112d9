"""The tasks the one training loop trains, and their registry.

Each module here declares one :class:`raydiff.train.task.TaskSpec` as ``SPEC``; the registry
finds them by listing this package, so adding a task is adding a module (and its name to
``raydiff.config``'s ``TaskName``, the config's list of choices). Nothing outside this package
compares a task's name or lists a task's metrics: it asks :func:`task_spec`.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import TYPE_CHECKING

from raydiff.errors import UserInputError

if TYPE_CHECKING:
    from raydiff.config import ExperimentConfig
    from raydiff.train.runtime import Runtime
    from raydiff.train.task import Task, TaskSpec


@functools.cache
def task_specs() -> dict[str, TaskSpec]:
    """Every task's spec by name, from the ``SPEC`` of each module of this package."""
    specs: dict[str, TaskSpec] = {}
    for module in pkgutil.iter_modules(__path__):
        spec = getattr(importlib.import_module(f"{__name__}.{module.name}"), "SPEC", None)
        if spec is not None:
            if spec.name in specs:
                raise RuntimeError(f"two task modules declare the task {spec.name!r}")
            specs[spec.name] = spec
    return specs


def task_spec(name: str) -> TaskSpec:
    """The spec of the task called ``name`` (``train.task``'s value)."""
    specs = task_specs()
    if name not in specs:
        raise UserInputError(f"unknown task {name!r}; valid: {', '.join(sorted(specs))}")
    return specs[name]


def task_of_config(config: ExperimentConfig, *, runtime: Runtime) -> Task:
    """The :class:`raydiff.train.task.TaskFactory` of ``train.task``: its spec's factory."""
    return task_spec(config.train.task).build(config, runtime=runtime)
