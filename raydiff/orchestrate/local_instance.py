"""On a local Ray instance, sweep trials and Train controllers start without a runtime_env.

Ray starts the process of an actor that has a ``runtime_env`` (even one of environment variables
only) through its runtime-env agent and ``setup_worker.py``: a first Python process imports Ray,
then execs the worker, a second one. Here that costs each such process 0.5-0.6 s more CPU and
0.4-0.6 s more time to start (docs/performance.md "Trial start-up"). Ray Tune gives every trial
actor one (``PL_DISABLE_FORK=1`` for PyTorch Lightning, plus the driver's Ray Train variables)
and Ray Train its controller (the driver's Ray Train variables plus
``RAY_WARN_BLOCKING_GET_INSIDE_ASYNC``), and every process they start inherits it: a trial's
report queue, its controller, the placement-group cleaner, the synchronisation actor, Ray
Data's DatasetManager and split coordinator; with 2 cores, all on the path to the first step.

Those variables are there to carry the driver's environment to processes on other nodes. The
processes of a local instance that raydiff started (``start_local_ray``: the variable
:data:`LOCAL_INSTANCE_VAR` marks them) are children of a raylet that inherited the driver's
environment and have every one of those variables already, so there raydiff starts trial actors
(:func:`trial_actors_inherit_environment`) and Train controllers
(:class:`EnvInheritingTrainer`) without one. Training workers keep Ray Train's (its variables
set in the environment, e.g. ``RAY_TRAIN_ENABLE_PREEMPTION_WATCHER=0``). On a cluster (an
``--address``, ``ray job submit``) nothing changes.

Both reach into Ray internals (``ray.tune.execution.class_cache``'s module constants, the
controller start of Ray Train's ``DataParallelTrainer``), checked for Ray 2.60 by
``tests/integration/test_sweep.py``, which asserts a trial's actors have no runtime_env.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import ray
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

LOCAL_INSTANCE_VAR = "RAYDIFF_LOCAL_RAY_INSTANCE"
"""Set in the environment of a local instance raydiff starts (its raylet and every process)."""


def on_local_instance() -> bool:
    """Whether this process belongs to a local Ray instance that raydiff started."""
    return os.environ.get(LOCAL_INSTANCE_VAR) == "1"


@contextlib.contextmanager
def trial_actors_inherit_environment() -> Iterator[None]:
    """While inside, on a local instance, Tune creates trial actors without a runtime_env.

    For the sweep driver's ``Tuner.fit``: Tune builds a trial actor's ``env_vars`` from
    ``class_cache.DEFAULT_ENV_VARS`` and the driver's values of
    ``class_cache.ENV_VARS_TO_PROPAGATE`` when it first creates an actor of the trainable.
    """
    if not on_local_instance():
        yield
        return
    from ray.tune.execution import class_cache

    saved = class_cache.DEFAULT_ENV_VARS, class_cache.ENV_VARS_TO_PROPAGATE
    class_cache.DEFAULT_ENV_VARS, class_cache.ENV_VARS_TO_PROPAGATE = {}, set()
    try:
        yield
    finally:
        class_cache.DEFAULT_ENV_VARS, class_cache.ENV_VARS_TO_PROPAGATE = saved


class EnvInheritingTrainer(DataParallelTrainer):
    """Ray Train's ``DataParallelTrainer`` whose controller, on a local instance, starts without
    a runtime_env (and so do the actors it starts, bar the training workers).

    Ray's ``_initialize_and_run_controller`` otherwise: the controller actor on the driver's
    node, a SIGINT handler that aborts the run when this is the main thread, then run it and
    return its result.
    """

    def _initialize_and_run_controller(self, **controller_init_kwargs: Any) -> Any:
        if not on_local_instance():
            return super()._initialize_and_run_controller(**controller_init_kwargs)
        from ray.train.v2._internal.execution.controller import TrainController

        controller_cls = ray.remote(
            num_cpus=0,
            label_selector={ray._raylet.RAY_NODE_ID_KEY: ray.get_runtime_context().get_node_id()},
        )(TrainController)
        controller = controller_cls.remote(**controller_init_kwargs)
        if threading.current_thread() is threading.main_thread():
            self._register_sigint_handler(controller)
        ray.get(controller.run.remote())
        return ray.get(controller.get_result.remote())
