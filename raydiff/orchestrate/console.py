"""What a Ray run prints on the console: raydiff's lines; Ray's own chatter stays in its log files.

Quiet is the default; ``raydiff -v`` (DEBUG on the ``raydiff`` logger) leaves Ray's console
output as Ray makes it. Everything here uses Ray's own switches and files are never affected:

- the driver's ``ray`` logger at WARNING (``ray.init(logging_level=...)``): no "Started a local
  Ray instance"; the token-auth notice a new local instance logs is dropped (auth stays on);
- Ray Train's ``LoggingConfig(log_level="WARNING")`` (:func:`train_log_level`): no "[State
  Transition]", "Attempting to start training worker group", "Setting up process group" on the
  console, while ``logs/train/ray-train-sys-*.log`` keep every level;
- in every process of the job (driver, and Ray's ``worker_process_setup_hook``
  :func:`quiet_ray_process` in each worker): Ray Data's INFO records (``Starting execution of
  Dataset``, its plan, ``execution finished``) and its "Progress bars disabled" notice carry
  Ray Data's ``hide`` attribute, which its console handler honours (``logs/ray-data/`` keep them),
  and deprecation/future warnings raised inside Ray's own modules are ignored.

Errors are untouched: a failing worker's traceback still comes back in the exception
the trainer's ``fit()`` raises, and WARNING/ERROR records of Ray Train and Ray Data still print.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from typing import Any

# Ray's worker_process_setup_hook: a function every worker process of the job runs at start.
QUIET_HOOK = f"{__name__}.quiet_ray_worker"
VERBOSE_HOOK = f"{__name__}.pin_ray_address"


def verbose() -> bool:
    """Whether the user asked for Ray's console output (``raydiff -v``)."""
    return logging.getLogger("raydiff").isEnabledFor(logging.DEBUG)


def ray_init_options(*, local: bool) -> dict[str, Any]:
    """Keyword arguments for this run's ``ray.init``: of a new local instance (``local``; its
    workers get the setup hook from :func:`local_instance_environment`), or of a driver joining
    a cluster (the hook travels in the job's ``runtime_env``)."""
    options: dict[str, Any] = {}
    if not verbose():
        # "Token authentication is enabled for this Ray cluster ..." on every new local instance
        # (auth stays on). RAY_AUTH_MODE=token would silence it too, but only before `import ray`.
        logging.getLogger("ray._private.authentication").setLevel(logging.ERROR)
        options["logging_level"] = logging.WARNING
    # Under `ray job submit` the job's runtime_env is merged with this one; the same key in both
    # is an error, so a job that brings its own setup hook keeps it (and Ray's worker output).
    job = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}"))
    if not local and "worker_process_setup_hook" not in (job.get("runtime_env") or {}):
        options["runtime_env"] = {"worker_process_setup_hook": setup_hook()}
    return options


def setup_hook() -> str:
    """This run's ``worker_process_setup_hook``, as the module path Ray imports it by."""
    return VERBOSE_HOOK if verbose() else QUIET_HOOK


def local_instance_environment() -> dict[str, str]:
    """Environment for a local Ray instance this process starts (its raylet and every worker
    inherit it): the setup hook in the variable through which Ray hands a job's hook to each
    worker. Not a job ``runtime_env``: with one, Ray prepares an environment for every new worker
    process, and each actor start took 0.4-0.5 s longer here (1.4 s against 0.95 s), about ten
    of them per training run."""
    from ray._private.ray_constants import WORKER_PROCESS_SETUP_HOOK_ENV_VAR

    return {WORKER_PROCESS_SETUP_HOOK_ENV_VAR: setup_hook()}


def train_log_level() -> str:
    """Ray Train's console level (``ray.train.LoggingConfig``) for this run."""
    return "INFO" if verbose() else "WARNING"


def pin_ray_address() -> None:
    """Point this Ray worker's own cluster lookups at its cluster (``worker_process_setup_hook``).

    Ray Train's PlacementGroupCleaner and TrainStateActor query the state API without an address;
    Ray then auto-detects the cluster, and on a machine running a second Ray instance (a ``ray
    start`` cluster, another run, the tests) their monitor threads die with "Found multiple
    active Ray instances" tracebacks. ``RAY_ADDRESS`` is what that lookup reads first.
    """
    import ray

    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address


def quiet_ray_worker() -> None:
    """The ``worker_process_setup_hook`` of a quiet run: runs in every worker before any task."""
    pin_ray_address()
    quiet_ray_process()


def quiet_ray_process() -> None:
    """Keep Ray Data's INFO lines and Ray's own deprecation warnings off this process's console.

    In every Ray worker of the job (:func:`quiet_ray_worker`) and in the driver
    (``quiet_ray_console``). Idempotent.
    """
    for category in (DeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category, module=r"ray(\.|$)")
    factory = logging.getLogRecordFactory()
    if getattr(factory, "hides_ray_data", False):
        return

    def record_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        if (record.name == "ray.data" or record.name.startswith("ray.data.")) and (
            record.levelno < logging.WARNING or str(record.msg).startswith("Progress bars")
        ):
            # ray.data._internal.logging.HiddenRecordFilter: off the console, still in the file.
            record.hide = True
        return record

    record_factory.hides_ray_data = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(record_factory)
