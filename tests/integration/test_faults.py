"""Faults injected into training on a real multi-node Ray cluster on this machine.

The cluster under test is not the session's in-process ``ray_cluster``: it is a
``ray.cluster_utils.Cluster`` (a head node and worker nodes, each node its own raylet and worker
processes) that a helper process runs: ``python tests/integration/test_faults.py`` (see
:func:`serve_cluster`), driven over stdin/stdout. Ray keeps per-process global state (the
internal KV client among it) that ``Cluster`` repoints at the cluster it starts, so the test
process itself never starts or joins one. Every training run is ``python jobs/train.py
--address <cluster>`` in a subprocess, exactly as a user runs it; its checkpoints go to a run
folder on local disk, which all the nodes of a one-machine cluster share (the "shared storage").

Layout: the head node has 1 logical CPU (Ray Data's read and decode tasks; the driver, Ray
Train's controller and the data split coordinator live there too, at 0 CPU), every worker node
has 2 and the runs ask for ``scaling.cpus_per_worker=2``: each of the 2 training workers is on a
worker node of its own, and none can be on the head. The node-removal test keeps a third, spare
worker node so that the worker group fits again after losing one (Ray Train restarts a fixed-size
group on whatever capacity is left; nothing autoscales here). For the loss-history actor's node
a node with 0 CPUs is added, that only the actor is placed on.

A driver start costs ~35-40 s here (Ray Train's worker group start is most of it), so runs are
shared where a fault allows, through module fixtures, still one test per fault: the Ctrl-C test's
same command is started twice at once, and the driver that wins the run folder is the run whose
actor node dies (``interrupted_run``); a copy of that finished run is continued past a truncated
checkpoint, loses the node of its rank 0 and then runs out of restarts
(``truncated_then_out_of_restarts``).

Each test prints what it injected and what recovery it measured; the figures (steps redone,
recovery time) are collected in a table printed at the end (``-s``) and appended as JSON lines to
``$RAYDIFF_FAULT_REPORT`` when that is set. How they are measured: rank 0 logs every step
(``train.log_interval=1``) with a timestamp; the driver's output carries those lines, tagged
with the worker's pid. "Steps redone" is the highest step the interrupted worker group's rank 0
logged minus the checkpoint step the next group resumed from (its "resumed from" line, and its
TensorBoard writer's start step). "Recovery" is the time from the injection to the first step the
new worker group finished (a lost node); from the injection to the restarted actor answering (the
actor's node); from the driver's start to its first step (the faults that take a new driver).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from test_job_submit import free_ports, train_arguments
from test_training import tensorboard_starts
from tiny_model import tiny_model

REPO = Path(__file__).resolve().parents[2]
HEAD_CPUS = 1
NODE_CPUS = 2  # = scaling.cpus_per_worker: one training worker per worker node
GLOBAL_BATCH = 8
WORKERS = 2
SAVE_INTERVAL = 4
PROTOCOL_PREFIX = "@fault-cluster "
RUN_TIMEOUT_S = 240

# The demo preset shrunk to a tiny model (as tests/integration/test_training.py's tiny_config),
# logging every step (the figures are per step), one checkpoint every SAVE_INTERVAL steps, all of
# them kept (the tests check every one).
TINY_RUN = [
    *tiny_model(attention="8"),
    "diffusion.diffusion_steps=500",
    "diffusion.noise_schedule=cosine",
    "optim.lr=1e-3",
    "optim.ema_rate=0.9",
    "train.precision=fp32",
    f"train.batch_size={GLOBAL_BATCH}",
    "train.log_interval=1",
    f"train.save_interval={SAVE_INTERVAL}",
    "train.eval_interval=0",
    "train.eval_num_images=8",
    "train.eval_timesteps=2",
    "train.sample_interval=0",
    "train.sample_count=4",
    "train.sample_steps=4",
    "train.schedule_sampler=loss-second-moment",
    f"scaling.num_workers={WORKERS}",
    f"scaling.cpus_per_worker={NODE_CPUS}",
    "scaling.checkpoints_to_keep=100",
    "scaling.sampler_refresh_interval=2",
    # Faster starts: no validation split (nor validation at the end), and the training split
    # streamed (decoded as the workers read it) instead of decoded into the object store by
    # the driver before the workers start (measured here: 35 s instead of 40-44 s to step 1).
    "data.val_split=",
    "data.cache_max_bytes=0",
]


def cluster_env() -> dict[str, str]:
    """The environment of the cluster's processes (every node's raylet and workers inherit it)
    and of the training drivers."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # Workers import this checkout; the cluster's server (this file run as a script) imports
    # the tests' shared modules (tiny_model), which pytest finds through tests/conftest.py.
    paths = [
        str(REPO),
        str(REPO / "tests"),
        *filter(None, env.get("PYTHONPATH", "").split(os.pathsep)),
    ]
    env.update(
        PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)),
        RAY_AUTH_MODE="disabled",  # a throwaway cluster: no token (docs/operations.md)
        RAY_USAGE_STATS_ENABLED="0",
        RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="0.2",  # report() is a barrier of one poll interval
        RAY_TRAIN_ENABLE_PREEMPTION_WATCHER="0",  # nothing preempts a test cluster
        RAY_DEDUP_LOGS="0",  # every worker line reaches the driver as it was printed
        # One thread per training worker: Ray would give each of them (2 CPUs) 2 OpenMP
        # threads, and 4 spinning threads on this machine's 2 shared cores are ~10x slower
        # than 2 (the nodes are simulated; a real 2-CPU node would have its own cores).
        OMP_NUM_THREADS="1",
    )
    return env


# --------------------------------------------------------------------------------------------
# The cluster: a helper process runs it (this file, run as a script), the tests drive it.


def serve_cluster(temp_dir: str) -> None:
    """Run a ``Cluster`` and answer JSON requests on stdin (one per line) until EOF.

    Requests: ``nodes``; ``add`` (cpus: one entry per node); ``remove`` (node_id, graceful); ``place_actor``
    (run_dir, num_timesteps, node_id: create the run's loss-history actor on that node, as the
    driver would create it, before the driver does); ``actor_info`` (run_dir: the actor's
    ``info()``, waiting while it restarts); ``named_actors``. Answers are lines starting with
    ``PROTOCOL_PREFIX``.
    """
    import ray
    from ray.cluster_utils import Cluster

    # The answers get stdout to themselves: the original descriptor is kept for them and fd 1
    # goes to the log. Ray prints on its own (a raylet's death notice, from another thread), as
    # may the processes it starts; such text once landed in the middle of an answer line.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    # Cluster writes its address to $RAY_TMPDIR/ray/ray_current_cluster (/tmp/ray/... by
    # default), where `address="auto"` looks: other Ray users of this machine must not find this
    # throwaway cluster there.
    os.environ["RAY_TMPDIR"] = temp_dir
    Path(temp_dir, "ray").mkdir(exist_ok=True)
    common = {"temp_dir": temp_dir}
    dashboard, agent = free_ports(2)
    cluster = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={
            **common,
            "num_cpus": HEAD_CPUS,
            # As on a real cluster: Ray Train's PlacementGroupCleaner and state tracking ask the
            # dashboard's state API about the run. Free ports: the defaults (8265, 52365) may
            # belong to another Ray instance on this machine.
            "include_dashboard": True,
            "dashboard_host": "127.0.0.1",
            "dashboard_port": dashboard,
            "dashboard_agent_listen_port": agent,
            # A node that dies without saying so (SIGKILL) is declared dead after 3 failed
            # health checks 1 s apart (Ray's defaults: 5 x 3 s). Refused connections fail a
            # check at once; a busy live raylet has the default 10 s to answer.
            "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3},
        },
    )
    nodes = {cluster.head_node.node_id: cluster.head_node}
    cpus = {cluster.head_node.node_id: HEAD_CPUS}  # each node's, as it was asked for

    def describe(node: Any) -> dict[str, Any]:
        return {
            "node_id": node.node_id,
            "raylet_pid": node.all_processes["raylet"][0].process.pid,
            "head": node is cluster.head_node,
            "num_cpus": cpus[node.node_id],
        }

    def respond(answer: Any) -> None:
        answers.write(PROTOCOL_PREFIX + json.dumps(answer) + "\n")

    def connect() -> None:
        if not ray.is_initialized():
            ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")

    def actor(run_dir: str) -> Any:
        from raydiff.orchestrate.loss_history_actor import ACTOR_NAMESPACE, actor_name

        connect()
        name = actor_name(run_dir)
        return ray.get_actor(name, namespace=ACTOR_NAMESPACE)

    respond({"address": cluster.address})
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        try:
            if op == "nodes":
                respond([describe(node) for node in nodes.values()])
            elif op == "add":  # several nodes start at once
                added = [
                    cluster.add_node(**common, num_cpus=n, wait=False) for n in request["cpus"]
                ]
                cluster.wait_for_nodes()
                for node, n in zip(added, request["cpus"], strict=True):
                    nodes[node.node_id], cpus[node.node_id] = node, n
                respond([describe(node) for node in added])
            elif op == "remove":
                start = time.monotonic()
                node = nodes.pop(request["node_id"])
                cluster.remove_node(node, allow_graceful=request["graceful"])
                respond({"seconds": time.monotonic() - start})
            elif op == "place_actor":
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                from raydiff.orchestrate.loss_history_actor import (
                    ACTOR_NAMESPACE,
                    LossHistoryActor,
                    actor_name,
                )

                connect()
                run_dir = Path(request["run_dir"])
                name = actor_name(run_dir)
                raylet = nodes[request["node_id"]].all_processes["raylet"][0].process.pid
                # Soft affinity also falls back to another node while the scheduler does not
                # know a just-added node yet: place it again until it is where it was asked.
                for _ in range(20):
                    handle = LossHistoryActor.options(  # get_or_create_actor's, plus a node
                        name=name,
                        namespace=ACTOR_NAMESPACE,
                        lifetime="detached",
                        # soft: when the node dies, Ray restarts the actor on another one
                        scheduling_strategy=NodeAffinitySchedulingStrategy(
                            request["node_id"], soft=True
                        ),
                    ).remote(request["num_timesteps"], str(run_dir), None)
                    info = ray.get(handle.info.remote())
                    if raylet in _ancestors(info["pid"]):
                        break
                    ray.kill(handle, no_restart=True)
                    while name in {a["name"] for a in ray.util.list_named_actors(True)}:
                        time.sleep(0.1)
                    time.sleep(0.5)
                respond(info)
            elif op == "actor_info":
                respond(ray.get(actor(request["run_dir"]).info.remote(), timeout=120))
            elif op == "named_actors":
                connect()
                respond(ray.util.list_named_actors(all_namespaces=True))
            else:
                respond({"error": f"unknown request {op!r}"})
        except Exception as error:  # the test shows it
            respond({"error": f"{type(error).__name__}: {error}"})
    if ray.is_initialized():
        ray.shutdown()
    cluster.shutdown()


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    raylet_pid: int
    head: bool
    num_cpus: int


class FaultCluster:
    """The test side of :func:`serve_cluster`."""

    def __init__(self, temp_dir: Path) -> None:
        self.temp_dir = temp_dir
        self.log = temp_dir / "cluster.log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, __file__, str(temp_dir)],
                cwd=REPO,
                env=cluster_env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        self.address = self._answer()["address"]

    def _answer(self) -> Any:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(PROTOCOL_PREFIX):
                answer = json.loads(line[len(PROTOCOL_PREFIX) :])
                if isinstance(answer, dict) and "error" in answer:
                    raise RuntimeError(f"cluster helper: {answer['error']}")
                return answer
        raise RuntimeError(f"the cluster helper exited: {self.log.read_text()[-3000:]}")

    def request(self, op: str, **args: Any) -> Any:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.process.stdin.flush()
        return self._answer()

    def nodes(self) -> list[NodeInfo]:
        return [NodeInfo(**node) for node in self.request("nodes")]

    def shape(self, *cpus: int) -> list[NodeInfo]:
        """Make the worker nodes exactly ``cpus`` (one entry per node), keeping nodes that fit."""
        wanted = sorted(cpus)
        for node in self.nodes():
            if node.head:
                continue
            if node.num_cpus in wanted:
                wanted.remove(node.num_cpus)
            else:
                self.request("remove", node_id=node.node_id, graceful=True)
        if wanted:
            self.request("add", cpus=wanted)
        return [node for node in self.nodes() if not node.head]

    def remove(self, node: NodeInfo, *, graceful: bool) -> None:
        self.request("remove", node_id=node.node_id, graceful=graceful)

    def node_of(self, pid: int) -> NodeInfo | None:
        """The node whose raylet started process ``pid`` (Ray workers are the raylet's children)."""
        by_raylet = {node.raylet_pid: node for node in self.nodes()}
        return next((by_raylet[p] for p in _ancestors(pid) if p in by_raylet), None)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()  # EOF: the helper shuts the cluster down
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _ancestors(pid: int) -> list[int]:
    """The parent, grandparent, ... of a live process."""
    found = []
    while (stat := _stat(pid)) is not None and stat[0] > 1:
        pid = stat[0]
        found.append(pid)
    return found


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state) of a live process; None when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else (int(fields[1]), fields[0])


@pytest.fixture(scope="module")
def fault_cluster() -> Iterator[FaultCluster]:
    # Short: Ray's Unix socket paths live under it (at most ~107 characters).
    temp_dir = Path(tempfile.mkdtemp(prefix="rdf-", dir="/tmp"))
    cluster = FaultCluster(temp_dir)
    try:
        yield cluster
    finally:
        cluster.close()
        _print_figures()
        shutil.rmtree(temp_dir, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# The training driver, as a user runs it.

PROGRESS = re.compile(
    r"pid=(?P<pid>\d+)[^)]*\)\s+(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \[rank 0\] "
    r"raydiff\.train\.loop: step (?P<step>\d+)/\d+"
)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
RESUMED = re.compile(r"\[rank 0\] raydiff\.train\.loop: resumed from (?P<path>\S+) at step (\d+)")


@dataclass(frozen=True)
class Step:
    pid: int  # rank 0's process: a new one for every worker group
    time: float  # when rank 0 logged it (after the optimiser step)
    step: int


class Driver:
    """``python jobs/train.py --config demo ... --address CLUSTER`` in a subprocess; its console
    (stdout and stderr) goes to a file."""

    def __init__(
        self,
        cluster: FaultCluster,
        data: Path,
        out: Path,
        *sets: str,
        name: str = "driver",
        env: dict[str, str] | None = None,
    ) -> None:
        self.out = out
        self.console = out.parent / f"{out.name}-{name}.log"
        self.command = [
            sys.executable,
            *train_arguments(data, out, *TINY_RUN, *sets),
            "--address",
            cluster.address,
        ]
        self.started = time.time()
        self.ended: float | None = None
        with self.console.open("w") as console:
            self.process = subprocess.Popen(
                self.command,
                cwd=REPO,
                env={**cluster_env(), **(env or {})},
                stdout=console,
                stderr=subprocess.STDOUT,
            )

    def text(self) -> str:
        """The console so far, without Ray's colour codes."""
        return ANSI.sub("", self.console.read_text(errors="replace"))

    def steps(self) -> list[Step]:
        return [
            Step(
                pid=int(m["pid"]),
                time=datetime.strptime(m["time"], "%Y-%m-%d %H:%M:%S,%f").timestamp(),
                step=int(m["step"]),
            )
            for m in PROGRESS.finditer(self.text())
        ]

    def wait_for(self, condition: Any, what: str, timeout: float = RUN_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.process.poll() is not None:
                pytest.fail(
                    f"the driver exited ({self.process.returncode}) before {what}:\n"
                    + self.text()[-4000:]
                )
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}:\n" + self.text()[-4000:])
            time.sleep(0.05)

    def wait_for_step(self, step: int, *, after_checkpoint: int | None = None) -> None:
        """Until rank 0 logged ``step`` (and checkpoint ``after_checkpoint`` is complete)."""

        def reached() -> bool:
            if after_checkpoint is not None and not _complete(self.out, after_checkpoint):
                return False
            return any(s.step >= step for s in self.steps())

        self.wait_for(reached, f"step {step}")

    def finish(self, timeout: float = RUN_TIMEOUT_S) -> int:
        try:
            code = self.process.wait(timeout=timeout)
            self.ended = self.ended or time.time()
            return code
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"the driver did not finish in {timeout} s:\n" + self.text()[-4000:])

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def driver(*args: Any, **kwargs: Any) -> Iterator[Driver]:
    """A :class:`Driver` that is killed if the test fails while it runs."""
    run = Driver(*args, **kwargs)
    try:
        yield run
    finally:
        run.kill()


def _complete(out: Path, step: int) -> bool:
    from raydiff.train.checkpoint import checkpoint_name, incomplete_reason

    folder = out / checkpoint_name(step)
    return folder.is_dir() and incomplete_reason(folder) is None


def train_worker_pids(cluster: FaultCluster, out: Path) -> list[int]:
    """This run's Ray Train worker processes on the cluster: titled ``ray::RayTrainWorker``,
    children of one of its raylets, in the run's working directory (``.../artifacts/RUN``)."""
    raylets = {node.raylet_pid for node in cluster.nodes()}
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            title = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            cwd = Path(os.readlink(proc / "cwd"))
        except OSError:
            continue
        stat = _stat(int(proc.name))
        if (
            title.startswith("ray::RayTrainWorker")
            and stat is not None
            and stat[0] in raylets
            and cwd.name == out.name
            and cwd.parent.name == "artifacts"
        ):
            pids.append(int(proc.name))
    return sorted(pids)


def current_group(cluster: FaultCluster, run: Driver) -> tuple[int, int]:
    """The pids of rank 0 (the process that logged the last step) and of the other worker of the
    run's current worker group (waiting while a failed group's processes are still exiting)."""
    rank0 = run.steps()[-1].pid

    def only_this_group() -> bool:
        workers = train_worker_pids(cluster, run.out)
        return len(workers) == 2 and rank0 in workers

    run.wait_for(only_this_group, "the worker group's 2 workers", timeout=60)
    return rank0, next(pid for pid in train_worker_pids(cluster, run.out) if pid != rank0)


def console_line(text: str, start: str) -> str:
    """The last line of a driver's console that starts with ``start`` ("" when none does)."""
    return next((line for line in reversed(text.splitlines()) if line.startswith(start)), "")


def checkpoint_steps(out: Path) -> list[int]:
    return sorted(int(p.name.removeprefix("checkpoint_")) for p in out.glob("checkpoint_0*"))


def assert_checkpoints_intact(out: Path) -> list[int]:
    """Every checkpoint folder left in ``out`` is complete, loads, and was taken while all ranks
    held the same weights (one equal fingerprint per rank); returns their steps."""
    from raydiff.train.checkpoint import incomplete_reason, load_checkpoint

    steps = checkpoint_steps(out)
    for step in steps:
        folder = out / f"checkpoint_{step:06d}"
        assert incomplete_reason(folder) is None, (folder, incomplete_reason(folder))
        state = load_checkpoint(folder)
        assert state["trainer"]["step"] == step, folder
        fingerprints = state["trainer"]["rank_weight_fingerprints"]
        assert len(fingerprints) == WORKERS, (folder, fingerprints)
        assert all(f == fingerprints[0] for f in fingerprints), (folder, fingerprints)
    return steps


def recorded_losses(checkpoint: Path) -> int:
    import torch

    trainer = torch.load(checkpoint / "trainer.pt", map_location="cpu", weights_only=True)
    return int(trainer["sampler"]["loss_counts"].sum())


@dataclass
class Recovery:
    """What the progress lines say about one interruption of a run."""

    last_step_before: int  # the highest step the interrupted worker group finished
    resumed_at: int  # the checkpoint step the next group started from
    first_step_after: Step  # the first step the next group finished
    redone: int = field(init=False)

    def __post_init__(self) -> None:
        self.redone = self.last_step_before - self.resumed_at


def recovery(steps_before: list[Step], steps_after: list[Step]) -> Recovery:
    """From rank 0's progress lines of the interrupted group and of the next one."""
    assert steps_before and steps_after, (steps_before, steps_after)
    first = min(steps_after, key=lambda s: s.time)
    return Recovery(
        last_step_before=max(s.step for s in steps_before),
        resumed_at=first.step - 1,
        first_step_after=first,
    )


# --------------------------------------------------------------------------------------------
# The figures for docs/operations.md, "What recovery costs".

FIGURES: list[dict[str, Any]] = []


def report(figures: dict[str, Any]) -> None:
    """Print one test's figures and keep them for the table (and $RAYDIFF_FAULT_REPORT)."""
    FIGURES.append(figures)
    print("\n" + "; ".join(f"{k}: {v}" for k, v in figures.items()))
    path = os.environ.get("RAYDIFF_FAULT_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(figures) + "\n")


def _print_figures() -> None:
    if not FIGURES:
        return
    columns = ["fault", "resumed_from", "steps_redone", "recovery_s"]
    rows = [[str(f.get(c, "-")) for c in columns] for f in FIGURES]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    print("\n" + "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


# --------------------------------------------------------------------------------------------
# The faults.


@dataclass
class InterruptedRun:
    """A run stopped with Ctrl-C, then continued by the same command, during which the node of
    its loss-history actor was killed (see :func:`interrupted_run`)."""

    out: Path
    max_steps: int
    first: Driver
    first_code: int
    stop_s: float  # from SIGINT to the driver's exit
    last_checkpoint: Path  # the newest complete checkpoint when the driver had exited
    workers_left: list[int]
    actor_left: bool
    again: Driver  # of the two drivers started at once, the one that trained
    again_code: int
    rival: Driver  # ... and the one refused the run folder
    rival_code: int
    actor_node: NodeInfo
    placed: dict[str, Any]  # the actor's info() before the fault
    after: dict[str, Any]  # ... and once Ray had restarted it
    new_node: NodeInfo | None  # where Ray restarted it
    injected: float  # when the actor's node was killed
    restarted: float  # when the restarted actor answered
    last_logged: int  # the last step logged before the node was killed


@pytest.fixture(scope="module")
def interrupted_run(fault_cluster, tiny_dataset, tmp_path_factory) -> InterruptedRun:
    """SIGINT to a driver mid-run, then the same command again; while that second driver
    trains, the node holding the run's loss-history actor (and no training worker) is killed.

    Two faults, one per test, in one run (a driver start less): the second driver's start
    (what the Ctrl-C test measures) is over before the actor's node dies. The same command is
    started twice at once the second time: one driver takes the run folder, the other must be
    refused (the run lock's test), at the cost of one process start, not of a run of its own.
    A 0-CPU actor lands on a random node (Ray's rule for actors that need no resources); to
    know which node to kill,
    the fixture creates the run's actor itself, with the driver's name and arguments, on a node
    with 0 CPUs (no worker fits there) before the second driver starts, whose
    ``get_or_create_actor`` then uses it.
    """
    nodes = fault_cluster.shape(0, NODE_CPUS, NODE_CPUS)
    actor_node = next(node for node in nodes if node.num_cpus == 0)
    out = (tmp_path_factory.mktemp("interrupted") / "interrupted").resolve()
    max_steps = 16
    args = (fault_cluster, tiny_dataset.path, out, f"train.max_steps={max_steps}")
    from raydiff.orchestrate.loss_history_actor import actor_name
    from raydiff.train.checkpoint import latest_checkpoint

    with driver(*args) as first:
        first.wait_for_step(SAVE_INTERVAL + 2, after_checkpoint=SAVE_INTERVAL)
        sigint = time.time()
        first.process.send_signal(signal.SIGINT)
        first_code = first.finish(timeout=120)
        stop_s = time.time() - sigint
    last_checkpoint = latest_checkpoint(out)
    assert last_checkpoint is not None, first.text()[-4000:]
    workers_left = train_worker_pids(fault_cluster, out)
    named = {a["name"] for a in fault_cluster.request("named_actors")}
    actor_left = actor_name(out) in named

    placed = fault_cluster.request(
        "place_actor", run_dir=str(out), num_timesteps=500, node_id=actor_node.node_id
    )
    assert fault_cluster.node_of(placed["pid"]) == actor_node, placed
    with driver(*args, name="again") as one, driver(*args, name="rival") as other:
        rival = first_to_exit(one, other)
        again = other if rival is one else one
        rival_code = rival.finish()
        resumed_at = int(last_checkpoint.name.removeprefix("checkpoint_"))
        again.wait_for_step(resumed_at + 2)
        last_logged = again.steps()[-1].step
        injected = time.time()
        fault_cluster.remove(actor_node, graceful=False)  # a crash: every process SIGKILLed
        # The actor's process goes when it notices its raylet is gone; until then it answers.
        deadline = time.monotonic() + 60
        while _stat(placed["pid"]) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        after = fault_cluster.request("actor_info", run_dir=str(out))  # waits for the restart
        restarted = time.time()
        new_node = fault_cluster.node_of(after["pid"])
        again_code = again.finish()
    return InterruptedRun(
        out=out,
        max_steps=max_steps,
        first=first,
        first_code=first_code,
        stop_s=stop_s,
        last_checkpoint=last_checkpoint,
        workers_left=workers_left,
        actor_left=actor_left,
        again=again,
        again_code=again_code,
        rival=rival,
        rival_code=rival_code,
        actor_node=actor_node,
        placed=placed,
        after=after,
        new_node=new_node,
        injected=injected,
        restarted=restarted,
        last_logged=last_logged,
    )


def test_ctrl_c_then_the_same_command_continues_the_run(interrupted_run):
    """SIGINT to the driver mid-run stops the run (its workers, its loss-history actor, the run
    folder's lock) with a message saying how to continue; the same command again continues
    from the last checkpoint, redoing at most one checkpoint interval, and finishes."""
    run = interrupted_run
    text, last = run.first.text(), run.last_checkpoint
    interrupted = run.first.steps()
    assert interrupted and max(s.step for s in interrupted) < run.max_steps, text[-4000:]
    message = console_line(text, "raydiff train: stopped by Ctrl-C")
    assert run.first_code == 130, text[-4000:]
    assert message == (
        "raydiff train: stopped by Ctrl-C (SIGINT); Ray Train stopped the run's workers. The "
        f"last complete checkpoint is {last} (step {int(last.name[11:])}): run the same command "
        "again to continue from it"
    ), text[-4000:]
    assert not run.workers_left, "the run's workers outlived the driver"
    assert not run.actor_left, "the run's loss-history actor outlived the driver"
    again_text = run.again.text()
    assert run.again_code == 0, again_text[-4000:]
    measured = recovery(interrupted, run.again.steps())
    assert f"resumed from {last} at step" in again_text, again_text[-4000:]
    assert measured.resumed_at == int(last.name[11:]) >= SAVE_INTERVAL, measured
    assert 0 <= measured.redone <= SAVE_INTERVAL, measured
    steps = assert_checkpoints_intact(run.out)
    assert steps == list(range(SAVE_INTERVAL, run.max_steps + 1, SAVE_INTERVAL))
    restart_s = measured.first_step_after.time - run.again.started
    print(
        f"\nSIGINT at step {measured.last_step_before}: the driver stopped the run in "
        f"{run.stop_s:.1f} s (exit {run.first_code}: {message!r}); the same command resumed from "
        f"checkpoint_{measured.resumed_at:06d}; finished at step {run.max_steps}; steps redone: "
        f"{measured.redone}; driver start to first step: {restart_s:.1f} s"
    )
    report(
        {
            "fault": "driver SIGINT, same command again",
            "resumed_from": f"checkpoint_{measured.resumed_at:06d}",
            "steps_redone": measured.redone,
            "recovery_s": round(restart_s, 1),
            "stop_s": round(run.stop_s, 1),
        }
    )


def test_the_node_of_the_loss_history_actor_dies(interrupted_run):
    """The node holding the run's loss-history actor (and no training worker) dies mid-run: Ray
    restarts the actor on another node, its history comes back from the newest checkpoint, and
    the workers go on without a restart (their calls wait for the new actor and reach it), all
    ranks with identical weights (every checkpoint records each rank's weight fingerprint; the
    loop stops a run whose ranks differ)."""
    run = interrupted_run
    out, after, placed = run.out, run.after, run.placed
    text = run.again.text()
    assert run.again_code == 0, text[-4000:]
    new_node = run.new_node
    assert after["pid"] != placed["pid"] and new_node is not None, (placed, after)
    assert new_node.node_id != run.actor_node.node_id
    # One worker group per driver: the actor's loss did not restart the second one.
    resumed_at = int(run.last_checkpoint.name[11:])
    assert tensorboard_starts(out) == [1, resumed_at + 1], text[-4000:]
    restored = Path(after["restored_from"] or "-")
    assert restored.parent == out and restored.name.startswith("checkpoint_0"), after
    restored_step = int(restored.name.removeprefix("checkpoint_"))
    steps = run.again.steps()
    steps_before_restart = max(s.step for s in steps if s.time < run.restarted)
    assert resumed_at <= restored_step <= steps_before_restart, (restored_step, after)
    # The history the new actor started from is the checkpoint's (plus records retried on it).
    assert after["num_recorded"] >= recorded_losses(restored), after
    checkpoints = assert_checkpoints_intact(out)
    counts = {step: recorded_losses(out / f"checkpoint_{step:06d}") for step in checkpoints}
    # Every loss up to the checkpoint the history came back from; never less history after the
    # fault than before it; both ranks' losses of every later interval; lost at most what the
    # dead actor recorded after that checkpoint, before its successor took over.
    assert all(counts[s] == s * GLOBAL_BATCH for s in checkpoints if s <= restored_step), counts
    assert all(a <= b for a, b in itertools.pairwise(counts.values())), counts
    for step in checkpoints:
        if step >= steps_before_restart + SAVE_INTERVAL:
            assert counts[step] - counts[step - SAVE_INTERVAL] == SAVE_INTERVAL * GLOBAL_BATCH
    lost = run.max_steps * GLOBAL_BATCH - counts[run.max_steps]
    # A rank records a step's losses before rank 0 logs that step: the dead actor may also hold
    # some of the step after the last one logged before the restart (seen: rank 1's half of it).
    in_flight = steps_before_restart + 1
    assert 0 <= lost <= (in_flight - restored_step) * GLOBAL_BATCH, (lost, counts)
    pause = max(b.time - a.time for a, b in itertools.pairwise(steps) if b.time > run.injected)
    print(
        f"\nkilled node {run.actor_node.node_id[:8]} (the loss-history actor's, no worker) at "
        f"step {run.last_logged}; the actor restarted on node {new_node.node_id[:8]} after "
        f"{run.restarted - run.injected:.1f} s with the history of {restored.name} "
        f"({recorded_losses(restored)} losses); no worker restart; finished at step "
        f"{run.max_steps}; losses lost: {lost} ({lost / GLOBAL_BATCH:g} steps' worth); longest "
        f"pause between steps: {pause:.1f} s"
    )
    report(
        {
            "fault": "loss-history actor's node killed",
            "resumed_from": f"{restored.name} (history)",
            "steps_redone": 0,
            "recovery_s": round(run.restarted - run.injected, 1),
            "losses_lost": lost,
            "pause_s": round(pause, 1),
        }
    )


def first_to_exit(*drivers: Driver, timeout: float = 120) -> Driver:
    """The first of ``drivers`` whose process ends (a driver refused the run folder ends within
    seconds; one that trains runs on)."""
    deadline = time.monotonic() + timeout
    while True:
        for run in drivers:
            if run.process.poll() is not None:
                run.ended = time.time()
                return run
        if time.monotonic() > deadline:
            pytest.fail(
                f"none of {len(drivers)} drivers into one run folder ended in {timeout} s:\n"
                + "\n".join(run.text()[-2000:] for run in drivers)
            )
        time.sleep(0.05)


def test_two_drivers_into_one_run_folder(interrupted_run):
    """Two drivers started at once with the same --output (the Ctrl-C test's same command,
    twice): one trains, the other is refused before it starts Ray, with the folder, the holder
    and what to do; nothing is mixed."""
    run = interrupted_run
    out, winner, loser = run.out, run.again, run.rival
    assert (run.again_code, run.rival_code) == (0, 1), loser.text()[-3000:]
    refusal = loser.text()
    assert (
        f"raydiff train: error: the run folder {out} is in use by another training run "
        f"(pid {winner.process.pid} on {socket.gethostname()}" in refusal
    ), refusal[-3000:]
    assert "give a new --output folder" in refusal
    assert "connected to the Ray cluster" not in refusal  # refused before Ray
    # One run's files: every checkpoint complete, one TensorBoard writer per driver that trained.
    steps = list(range(SAVE_INTERVAL, run.max_steps + 1, SAVE_INTERVAL))
    assert assert_checkpoints_intact(out) == steps
    resumed_at = int(run.last_checkpoint.name.removeprefix("checkpoint_"))
    assert tensorboard_starts(out) == [1, resumed_at + 1]
    # One loss history: no more losses than the run's steps (the actor's node dies in this run,
    # so some may be missing: test_the_node_of_the_loss_history_actor_dies bounds those).
    final = out / f"checkpoint_{run.max_steps:06d}"
    assert recorded_losses(final) <= run.max_steps * GLOBAL_BATCH
    assert loser.ended is not None
    refused_s = loser.ended - loser.started
    print(
        f"\ntwo drivers into {out.name} at once: pid {winner.process.pid} trained to step "
        f"{run.max_steps}, pid {loser.process.pid} was refused (exit 1) {refused_s:.1f} s after "
        "it started, before starting Ray"
    )
    report({"fault": "two drivers, one --output", "refused_after_s": round(refused_s, 1)})


@dataclass(frozen=True)
class TruncatedThenOutOfRestarts:
    out: Path
    driver: Driver
    code: int
    truncated: Path  # the model.pt cut short
    size: int  # its size before
    removed: NodeInfo  # the node of the first worker group's rank 0, removed
    removed_rank0: int  # that rank 0's pid
    injected: float  # when the node was removed
    restarted: dict[int, NodeInfo | None]  # the restarted group's pids and their nodes
    restarted_rank0: int
    restarted_checkpoint: int  # a checkpoint the restarted group wrote before its worker died
    killed: tuple[int, int]  # (pid, the last step logged) of the killed worker


@pytest.fixture(scope="module")
def truncated_then_out_of_restarts(
    fault_cluster, tiny_dataset, interrupted_run, tmp_path_factory
) -> TruncatedThenOutOfRestarts:
    """A copy of the interrupted run once finished (checkpoints 4 to 16) whose newest checkpoint
    is cut short on disk, run again with ``train.max_steps=40 scaling.max_failures=1``: the
    driver resumes past the truncated checkpoint and trains on; once it has written checkpoint 16
    again, the node of rank 0 (the checkpoint writer) is removed, and the group restarts on the
    other worker node and the spare one; once that group has written a checkpoint, one of its
    workers is killed (out of restarts). Three faults, one driver start: the truncated-checkpoint
    test checks the first resume, the removed-node test the restart, the out-of-restarts test
    the end.
    """
    fault_cluster.shape(NODE_CPUS, NODE_CPUS, NODE_CPUS)  # 2 workers + a spare node
    out = tmp_path_factory.mktemp("truncated") / "again"
    # copytree keeps the files' times: the run's own TensorBoard files stay the oldest.
    shutil.copytree(interrupted_run.out, out)
    newest = interrupted_run.max_steps
    model = out / f"checkpoint_{newest:06d}" / "model.pt"
    size = model.stat().st_size
    os.truncate(model, size // 2)
    with driver(
        fault_cluster,
        tiny_dataset.path,
        out,
        "train.max_steps=40",
        "scaling.max_failures=1",
        name="again",
    ) as run:
        run.wait_for_step(newest + 1, after_checkpoint=newest)
        rank0, rank1 = current_group(fault_cluster, run)
        removed, other = fault_cluster.node_of(rank0), fault_cluster.node_of(rank1)
        assert removed is not None and not removed.head, (rank0, removed)
        assert other is not None and other.node_id != removed.node_id, "2 workers on one node"
        injected = time.time()
        fault_cluster.remove(removed, graceful=True)
        # The restarted group writes a checkpoint of its own and trains past it.
        restarted_checkpoint = newest + 2 * SAVE_INTERVAL

        def past_its_checkpoint() -> bool:
            return _complete(out, restarted_checkpoint) and any(
                s.pid != rank0 and s.step > restarted_checkpoint for s in run.steps()
            )

        run.wait_for(past_its_checkpoint, f"the restarted group's step {restarted_checkpoint}")
        restarted_rank0, victim = current_group(fault_cluster, run)
        restarted = {pid: fault_cluster.node_of(pid) for pid in (restarted_rank0, victim)}
        os.kill(victim, signal.SIGKILL)
        killed = (victim, run.steps()[-1].step)
        code = run.finish()
    return TruncatedThenOutOfRestarts(
        out=out,
        driver=run,
        code=code,
        truncated=model,
        size=size,
        removed=removed,
        removed_rank0=rank0,
        injected=injected,
        restarted=restarted,
        restarted_rank0=restarted_rank0,
        restarted_checkpoint=restarted_checkpoint,
        killed=killed,
    )


def test_a_truncated_checkpoint_is_never_resumed_from(truncated_then_out_of_restarts):
    """The newest checkpoint was cut short on disk (a copy interrupted by a crash leaves the
    folder and its file list, with a short file): running the driver again resumes from the
    checkpoint before it, with a warning naming the one it skipped, and writes it again."""
    run = truncated_then_out_of_restarts
    out, text, size = run.out, run.driver.text(), run.size
    newest = run.truncated.parent
    newest_step = int(newest.name.removeprefix("checkpoint_"))
    before = out / f"checkpoint_{newest_step - SAVE_INTERVAL:06d}"
    assert (
        f"skipping {newest}: not a complete checkpoint (model.pt has {size // 2} bytes, "
        f"files.json says {size})" in text
    ), text[-4000:]
    # The first worker group resumed from the checkpoint before; the restarted one (after the
    # node went, once the newest had been written again, complete) from the newest or later.
    resumed = [Path(m["path"]) for m in RESUMED.finditer(text)]
    assert resumed[0] == before, (resumed, text[-4000:])
    assert all(int(p.name.removeprefix("checkpoint_")) >= newest_step for p in resumed[1:])
    # [0] and [1] are the copied run's two drivers; [2] is the first writer of this one.
    assert tensorboard_starts(out)[2] == newest_step - SAVE_INTERVAL + 1
    # The skipped interval was trained again and the newest checkpoint written again, complete.
    checkpoints = list(range(SAVE_INTERVAL, newest_step + 1, SAVE_INTERVAL))
    assert assert_checkpoints_intact(out)[: len(checkpoints)] == checkpoints
    first = min(run.driver.steps(), key=lambda s: s.time)
    restart_s = first.time - run.driver.started
    print(
        f"\ntruncated {run.truncated.relative_to(out)} to {size // 2} of {size} bytes; the "
        f"driver skipped it and resumed from {before.name}; steps redone: {SAVE_INTERVAL}; "
        f"driver start to first step: {restart_s:.1f} s"
    )
    report(
        {
            "fault": "newest checkpoint truncated",
            "resumed_from": before.name,
            "steps_redone": SAVE_INTERVAL,
            "recovery_s": round(restart_s, 1),
        }
    )


def test_a_removed_node_with_a_training_worker(truncated_then_out_of_restarts):
    """The node of rank 0 (the checkpoint writer) is removed mid-run: Ray Train restarts the
    worker group on the remaining nodes (the spare one included) from the newest complete
    checkpoint, and the restarted group trains on with the loss history of that checkpoint."""
    run = truncated_then_out_of_restarts
    out, text = run.out, run.driver.text()
    steps = run.driver.steps()
    before = [s for s in steps if s.pid == run.removed_rank0]
    after = [s for s in steps if s.pid == run.restarted_rank0]
    measured = recovery(before, after)
    assert measured.first_step_after.time > run.injected
    # One restart, from a checkpoint of this run (the newest complete one: the one before the
    # last when rank 0's node went down while copying that), not from step 0.
    assert tensorboard_starts(out)[3:] == [measured.resumed_at + 1], text[-4000:]
    assert measured.resumed_at > 0 and measured.resumed_at % SAVE_INTERVAL == 0, measured
    assert 0 <= measured.redone <= 2 * SAVE_INTERVAL, measured
    assert f"resumed from {out / f'checkpoint_{measured.resumed_at:06d}'}" in text, text[-4000:]
    # Both restarted workers ran elsewhere (their nodes were read while they ran).
    nodes = set(run.restarted.values())
    assert None not in nodes and run.removed not in nodes, (run.removed, run.restarted)
    # The loss history went back to the resumed checkpoint's, then grew: one entry per trained
    # sample (history lost in the restart would count fewer, a stale actor's more). The copied
    # run lost some when its actor's node died, so the count is relative to the resumed one's.
    resumed = recorded_losses(out / f"checkpoint_{measured.resumed_at:06d}")
    written = recorded_losses(out / f"checkpoint_{run.restarted_checkpoint:06d}")
    assert written - resumed == (run.restarted_checkpoint - measured.resumed_at) * GLOBAL_BATCH
    recovery_s = measured.first_step_after.time - run.injected
    print(
        f"\nremoved node {run.removed.node_id[:8]} (rank 0's) at step "
        f"{measured.last_step_before}; resumed from checkpoint_{measured.resumed_at:06d}; "
        f"steps redone: {measured.redone}; recovery took {recovery_s:.1f} s"
    )
    report(
        {
            "fault": "node with rank 0 removed",
            "resumed_from": f"checkpoint_{measured.resumed_at:06d}",
            "steps_redone": measured.redone,
            "recovery_s": round(recovery_s, 1),
        }
    )


def test_a_run_out_of_restarts_stops_with_a_clear_message(truncated_then_out_of_restarts):
    """With scaling.max_failures=1, a worker killed after the restart that a lost node took ends
    the run: the driver says the run failed after 1 restart, names its last complete checkpoint and how to continue
    (exit code 3, no traceback), and every complete checkpoint loads."""
    from raydiff.train.checkpoint import latest_checkpoint

    run = truncated_then_out_of_restarts
    out, code, text = run.out, run.code, run.driver.text()
    last = latest_checkpoint(out)
    assert last is not None
    error = console_line(text, "raydiff train: error:")
    assert code == 3, text[-4000:]
    assert error.startswith(
        "raydiff train: error: training failed after 1 restart (scaling.max_failures=1): rank "
    ), error
    assert (
        f"The last complete checkpoint is {last} (step {int(last.name[11:])}): run the same "
        "command again to continue from it" in error
    ), error
    # No traceback of the driver's own (Ray's log lines of the failures come tagged "(pid=...)").
    assert not [line for line in text.splitlines() if line.startswith("Traceback")], text[-4000:]
    complete = assert_checkpoints_intact(out)
    print(
        f"\nkilled a training worker at step {run.killed[1]} after a restart, with "
        f"max_failures=1; the driver exited {code} naming {last.name} (checkpoints left: "
        f"{complete}):\n{error}"
    )
    report(
        {
            "fault": "a second failure (worker killed), max_failures=1",
            "resumed_from": f"- (error names {last.name})",
            "exit_code": code,
        }
    )


if __name__ == "__main__":
    serve_cluster(sys.argv[1])
