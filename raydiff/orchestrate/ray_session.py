"""A run's Ray session: join the cluster it is given or start a local instance, and keep Ray's own
chatter off the console (what is left out, and why: docs/training.md).

Quiet is the default; ``raydiff -v`` (DEBUG on the ``raydiff`` logger) leaves Ray's console
output as Ray makes it. Only Ray's public switches are used (``ray.init(logging_level=...)``,
``LoggingConfig``, ``RAY_DEDUP_LOGS_SKIP_REGEX``, the ``worker_process_setup_hook`` of the
job's ``runtime_env``); Ray's log files keep what they keep, and errors are untouched.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
import warnings
from typing import Any

logger = logging.getLogger(__name__)

# Ray's console lines that a quiet run leaves out, as regular expressions over a line's text;
# each says nothing its reader can act on. `raydiff -v` prints them.
RAY_NOISE = (
    # Ray Data, once in every process that runs a dataset with progress bars off: raydiff turns
    # them off (its own step lines say how far a run is), so the notice comes from the driver and
    # from every training worker.
    r"Progress bars disabled\. To enable, set",
    # Ray Core at ERROR, from every Ray Train controller: Train's own PreemptionWatcher actor is
    # restartable and takes the workers' actor handles as arguments (which Ray keeps in the
    # object store). Nothing in raydiff creates it; ray.train.get_preemption_info needs it.
    r"Actor with class name: 'PreemptionWatcher' .*has constructor arguments in the object store",
)
SKIP_REGEX_VARIABLE = "RAY_DEDUP_LOGS_SKIP_REGEX"


def verbose() -> bool:
    """Whether the user asked for Ray's console output (``raydiff -v``)."""
    return logging.getLogger("raydiff").isEnabledFor(logging.DEBUG)


def ensure_ray(
    *, address: str | None, num_workers: int, cpus_per_worker: float, extra_cpus: float = 0.0
) -> None:
    """Join the Ray cluster at ``address``, else start a local instance for this run.

    ``address``: ``auto`` (the cluster a ``ray start`` on this machine runs), ``HOST:PORT`` or
    ``ray://...``; ``None`` takes ``RAY_ADDRESS`` (what ``ray job submit`` sets for its driver)
    and without it starts a new local instance. Never ``ray.init()``'s own guess: on a machine
    where another process runs a private instance it would join that, and the run would die
    with that process.
    """
    import ray

    if ray.is_initialized():
        return
    # The dashboard's Train page needs state tracking switched on in the driver.
    os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_TRACKING", "1")
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    if address != "local":
        ray.init(address=address, **ray_init_options())
        logger.info("connected to the Ray cluster at %s", address)
        return
    # Training workers must not take every CPU or Ray Data has none left to decode with, hence
    # the spare logical CPUs.
    needed = math.ceil(num_workers * cpus_per_worker + extra_cpus) + 2
    context = start_local_ray(num_cpus=max(os.cpu_count() or 1, needed), **ray_init_options())
    logger.info(
        "started a local Ray instance (dashboard: http://%s; Ray's logs: %s/logs)",
        context.dashboard_url or "-",
        context.address_info["session_dir"],
    )


def report_capacity(*, min_workers: int, cpus_per_worker: float, use_gpu: bool) -> bool:
    """Say so, at start, when the cluster cannot hold ``min_workers`` training workers now: Ray
    Train then waits for nodes to join, logging nothing, and a user would see a silent run.
    Returns whether they fit."""
    import ray

    total = ray.cluster_resources()
    key, each = ("GPU", 1.0) if use_gpu else ("CPU", cpus_per_worker)
    fits = int(total.get(key, 0.0) // each + 1e-9)
    if fits >= min_workers:
        return True
    logger.warning(
        "waiting for %d workers' resources (%g %s each); the cluster has %g %s (room for %d): "
        "the run starts when nodes join",
        min_workers,
        each,
        key,
        total.get(key, 0.0),
        key,
        max(fits, 0),
    )
    return False


def start_local_ray(*, num_cpus: int, **init_kwargs: Any) -> Any:
    """Start a new local Ray instance of ``num_cpus`` logical CPUs whose workers run raydiff's
    setup hook (added to ``init_kwargs``' ``runtime_env``, unless it names one). The other
    ``init_kwargs`` go to ``ray.init`` as given. Returns ``ray.init``'s ``RayContext``."""
    import ray

    runtime_env = dict(init_kwargs.pop("runtime_env", None) or {})
    runtime_env.setdefault("worker_process_setup_hook", _setup_hook())
    return ray.init(address="local", num_cpus=num_cpus, runtime_env=runtime_env, **init_kwargs)


def ray_init_options() -> dict[str, Any]:
    """Keyword arguments for this run's ``ray.init``: the console level and, for a driver
    joining a cluster, the job's ``runtime_env`` with raydiff's worker setup hook."""
    options: dict[str, Any] = {}
    if not verbose():
        options["logging_level"] = logging.WARNING
    # Under `ray job submit` the job's runtime_env is merged with this one; the same key in both
    # is an error, so a job that brings its own setup hook keeps it (and Ray's worker output).
    job = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}"))
    if "worker_process_setup_hook" not in (job.get("runtime_env") or {}):
        options["runtime_env"] = {"worker_process_setup_hook": _setup_hook()}
    return options


def _setup_hook() -> str:
    """This run's ``worker_process_setup_hook``, as the module path Ray imports it by."""
    return f"{__name__}.{'pin_ray_address' if verbose() else 'quiet_ray_worker'}"


def skip_ray_noise() -> None:
    """Have this process's Ray leave :data:`RAY_NOISE` out when it prints its workers' output,
    through ``RAY_DEDUP_LOGS_SKIP_REGEX``, which Ray reads when it is imported (so the command
    line calls this first; a no-op once Ray is imported). A pattern the user set is kept."""
    if verbose() or "ray" in sys.modules:
        return
    ours = "|".join(RAY_NOISE)
    theirs = os.environ.get(SKIP_REGEX_VARIABLE)
    os.environ[SKIP_REGEX_VARIABLE] = f"{theirs}|{ours}" if theirs else ours


class RayNoiseFilter(logging.Filter):
    """Drops the records of :data:`RAY_NOISE` (a filter for a console handler)."""

    pattern = re.compile("|".join(RAY_NOISE))

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


def quiet_ray_console() -> None:
    """Keep Ray's own INFO lines and deprecation notices off this process's console.

    The driver's half (every Ray worker runs :func:`quiet_ray_worker`): also where Ray was
    started by someone else (a Tune trial). ``raydiff -v`` keeps them.
    """
    if verbose():
        return
    # tensorboardX: Tune's TensorBoard callback in this process (the module docstring).
    names = ["ray", "ray.tune", "tensorboardX"]
    # Ray Data sets its logger's level and handlers when it is imported: once loaded (Ray Train
    # and Tune load it) they can be set. Not imported here for that: a second of start-up for a
    # driver that reads no dataset.
    if "ray.data" in sys.modules:
        names.append("ray.data")
        # The ray.data logger does not propagate: RayNoiseFilter on its console handlers, once
        # each; its log file (ray-data.log) keeps every line.
        for handler in logging.getLogger("ray.data").handlers:
            console = isinstance(handler, logging.StreamHandler) and not isinstance(
                handler, logging.FileHandler
            )
            if console and not any(isinstance(f, RayNoiseFilter) for f in handler.filters):
                handler.addFilter(RayNoiseFilter())
    for name in names:
        logging.getLogger(name).setLevel(logging.WARNING)
    ignore_ray_deprecations()


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
    ignore_ray_deprecations()


def ignore_ray_deprecations() -> None:
    """Ignore deprecation and future warnings that Ray's own modules raise (Ray's to fix)."""
    for category in (DeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category, module=r"ray(\.|$)")
