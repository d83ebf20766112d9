"""The tasks the one training loop trains (``raydiff.train.task.Task``): one module each, and
:func:`task_of_config`, the loop's default factory, which builds the one ``train.task`` names."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raydiff.config import ExperimentConfig
    from raydiff.train.runtime import Runtime
    from raydiff.train.task import Task


def task_of_config(config: ExperimentConfig, *, runtime: Runtime) -> Task:
    """The :class:`raydiff.train.task.TaskFactory` of ``train.task``: the diffusion model
    (:mod:`.diffusion`), the noisy classifier (:mod:`.classifier`) or the upsampler
    (:mod:`.super_res`)."""
    if config.train.task == "classifier":
        from raydiff.train.tasks.classifier import classifier_task

        return classifier_task(config, runtime=runtime)
    if config.train.task == "super_res":
        from raydiff.train.tasks.super_res import super_res_task

        return super_res_task(config, runtime=runtime)
    from raydiff.train.tasks.diffusion import diffusion_task

    return diffusion_task(config, runtime=runtime)
