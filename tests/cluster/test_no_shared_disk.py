"""Training and sampling on Ray nodes that share no disk (tests/cluster/netns_cluster.py), with
their inputs and outputs in a real S3 bucket, as on a real cluster; and the refusals that keep
a run from starting where it cannot work.

Every command is what a user on the head machine types (``raydiff train ... --address HEAD``),
run as a driver in the head node's namespaces.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from netns_cluster import NetnsCluster, Node
from s3_server import READ_ONLY_KEY
from tiny_model import tiny_model

pytestmark = pytest.mark.cluster

SAVE_INTERVAL = 4
MAX_STEPS = 12
RUN_TIMEOUT_S = 240
BATCH = 8
# The tiny model (tests/tiny_model.py), logging every step, every checkpoint kept. One training
# worker per worker node: 1.5 of a node's 2 CPUs, so that two never share one and none fits on
# the 1-CPU head.
TINY_RUN = [
    *tiny_model(),
    "diffusion.diffusion_steps=100",
    "diffusion.noise_schedule=cosine",
    "optim.lr=1e-3",
    "optim.ema_rate=0.9",
    "train.precision=fp32",
    f"train.batch_size={BATCH}",
    "train.log_interval=1",
    f"train.save_interval={SAVE_INTERVAL}",
    "train.eval_interval=0",
    "train.sample_interval=0",
    "train.schedule_sampler=loss-second-moment",
    "scaling.num_workers=2",
    "scaling.cpus_per_worker=1.5",
    "scaling.checkpoints_to_keep=100",
    "data.val_split=",
    "data.cache_max_bytes=0",
]
STEP = re.compile(
    r"pid=(?P<pid>\d+), ip=(?P<ip>[\d.]+)\)\s+\S+ \S+ \[rank 0\] raydiff\.train\.loop: "
    r"step (?P<step>\d+)/\d+"
)
RESUMED = re.compile(r"\[rank 0\] raydiff\.train\.loop: resumed from (?P<path>\S+) at step")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def train_argv(cluster: NetnsCluster, *, data: str, output: str, sets: list[str]) -> list[str]:
    """``raydiff train`` on the demo preset shrunk to TINY_RUN, on the cluster."""
    overrides = [arg for item in [*TINY_RUN, *sets] for arg in ("--set", item)]
    return [
        *("raydiff", "train", "--config", "demo", "--data", data, "--output", output),
        *("--address", cluster.address, *overrides),
    ]


def error_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if "error:" in line]


def test_a_local_output_no_other_node_sees_is_refused_before_anything_starts(
    netns_cluster: NetnsCluster, tiny_data
) -> None:
    """``--output`` on the head's own disk: the worker nodes cannot see it, so the run is
    refused in one line naming the path, a node and the fix, before any worker starts."""
    _, data = tiny_data
    output = netns_cluster.head.private / "runs" / "local"
    done = netns_cluster.driver(
        train_argv(netns_cluster, data=data, output=str(output), sets=["train.max_steps=4"]),
        timeout=120,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    (line,) = error_lines(done)
    workers = {node.ip for node in netns_cluster.nodes[1:]}
    assert line.startswith(f"raydiff train: error: --output {output} is a local path that node ")
    assert any(f"node {ip} of the cluster" in line for ip in workers), line
    assert "give a URI (s3://bucket/...) or a folder mounted at the same path on every node" in line
    assert "Traceback" not in done.stderr and "raydiff.train.loop" not in done.stderr


def test_a_bucket_the_key_may_not_write_is_refused_before_anything_starts(
    netns_cluster: NetnsCluster, tiny_data
) -> None:
    """A read-only key, and a bucket the key may not use: one line naming the URI and the
    store's answer each, exit 1, nothing written."""
    _, data = tiny_data
    bucket = netns_cluster.bucket
    cases = {
        f"s3://{bucket}/runs/read-only": netns_cluster.s3_environment(access_key=READ_ONLY_KEY),
        "s3://another-bucket/run": {},
    }
    for output, env in cases.items():
        done = netns_cluster.driver(
            train_argv(netns_cluster, data=data, output=output, sets=["train.max_steps=4"]),
            env=env,
            timeout=120,
        )
        assert done.returncode == 1, (output, done.stderr[-3000:])
        (line,) = error_lines(done)
        assert line.startswith("raydiff train: error: ") and output in line, line
        assert "AccessDenied" in line or "ACCESS_DENIED" in line, line
    assert netns_cluster.keys("runs/read-only") == set()


class Driver:
    """A driver on the head in the background; its console goes to a file."""

    def __init__(self, cluster: NetnsCluster, argv: list[str], console: Path) -> None:
        self.console = console
        with console.open("w") as out:
            self.process = subprocess.Popen(
                cluster.driver_argv(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=cluster.head.private.parent,
                start_new_session=True,
            )

    def text(self) -> str:
        return ANSI.sub("", self.console.read_text(errors="replace"))

    def steps(self) -> list[tuple[str, int]]:
        """(node address, step) of every step rank 0 logged."""
        return [(m["ip"], int(m["step"])) for m in STEP.finditer(self.text())]

    def wait_for(self, condition, what: str, timeout: float = RUN_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.process.poll() is not None:
                pytest.fail(
                    f"the driver exited ({self.process.returncode}) before {what}:\n"
                    + self.text()[-4000:]
                )
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}:\n" + self.text()[-4000:])
            time.sleep(0.2)

    def finish(self, timeout: float = RUN_TIMEOUT_S) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the driver did not finish in {timeout} s:\n" + self.text()[-4000:])

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def driver(cluster: NetnsCluster, argv: list[str], console: Path) -> Iterator[Driver]:
    run = Driver(cluster, argv, console)
    try:
        yield run
    finally:
        run.kill()


@dataclass(frozen=True)
class LostNodeRun:
    uri: str
    text: str
    code: int
    lost: Node  # the node of rank 0, killed after the first checkpoint
    last_step_before: int  # the last step rank 0 logged before
    checkpoints: dict[int, tuple[str, int]]  # step -> (incomplete reason or '', losses recorded)


def checkpoint_states(cluster: NetnsCluster, uri: str) -> dict[int, tuple[str, int]]:
    """Every checkpoint of the run at ``uri``: its step -> (why it is incomplete, '' if it is
    not; how many losses its loss-aware sampler had recorded), read with raydiff's own reader
    on the head."""
    code = (
        "import sys\n"
        "from raydiff.storage import as_location, local_copy\n"
        "from raydiff.train.checkpoint import incomplete_reason, load_checkpoint\n"
        "for folder in sorted(as_location(sys.argv[1]).iterdir(), key=str):\n"
        "    if not (folder.name[11:].isdigit() and folder.name.startswith('checkpoint_')):\n"
        "        continue\n"
        "    with local_copy(folder) as path:\n"
        "        counts = load_checkpoint(path)['trainer']['sampler']['loss_counts'].sum()\n"
        "    print(int(folder.name[11:]), int(counts), incomplete_reason(folder) or '')\n"
    )
    done = cluster.driver(["python", "-c", code, uri], timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    states = {}
    for line in done.stdout.splitlines():
        step, counts, reason = [*line.split(" ", 2), ""][:3]
        states[int(step)] = (reason.strip(), int(counts))
    return states


@pytest.fixture(scope="module")
def lost_node_run(netns_cluster: NetnsCluster, tiny_data, tmp_path_factory) -> LostNodeRun:
    """A 2-node training to S3 whose rank 0's node is killed (SIGKILL of every process of that
    machine) once the first checkpoint is in the bucket; a new, empty node joins (the machine
    replaced), and Ray Train restarts the worker group there, from the bucket."""
    _, data = tiny_data
    uri = f"s3://{netns_cluster.bucket}/runs/lost-node"
    argv = train_argv(netns_cluster, data=data, output=uri, sets=[f"train.max_steps={MAX_STEPS}"])
    console = tmp_path_factory.mktemp("lost-node") / "driver.log"
    first = f"runs/lost-node/checkpoint_{SAVE_INTERVAL:06d}/files.json"
    with driver(netns_cluster, argv, console) as run:
        run.wait_for(
            lambda: (
                any(step > SAVE_INTERVAL for _, step in run.steps())
                and first in netns_cluster.keys("runs/lost-node/")
            ),
            f"step {SAVE_INTERVAL + 1} and checkpoint {SAVE_INTERVAL} in the bucket",
        )
        ip, last = run.steps()[-1]
        lost = next(node for node in netns_cluster.nodes if node.ip == ip)
        assert lost is not netns_cluster.head, "rank 0 ran on the head"
        netns_cluster.kill_node(lost)
        netns_cluster.add_node(num_cpus=2)
        code = run.finish()
        text = run.text()
    return LostNodeRun(
        uri=uri,
        text=text,
        code=code,
        lost=lost,
        last_step_before=last,
        checkpoints=checkpoint_states(netns_cluster, uri),
    )


def test_a_run_to_s3_that_loses_a_node_continues_from_the_bucket(lost_node_run) -> None:
    """The run finishes (exit 0), its worker group restarted once from a checkpoint in the
    bucket (not from step 0: the new node's disk is empty), at most two save intervals redone,
    every checkpoint in the bucket is complete, the last one at max_steps, and the loss-aware
    sampler's history carried on through the restart."""
    run = lost_node_run
    assert run.code == 0, run.text[-4000:]
    resumed = [m["path"] for m in RESUMED.finditer(run.text)]
    assert len(resumed) == 1 and resumed[0].startswith(f"{run.uri}/checkpoint_"), resumed
    resumed_at = int(resumed[0].rsplit("_", 1)[1])
    assert resumed_at >= SAVE_INTERVAL and resumed_at % SAVE_INTERVAL == 0, resumed_at
    assert 0 <= run.last_step_before - resumed_at <= 2 * SAVE_INTERVAL
    steps = list(range(SAVE_INTERVAL, MAX_STEPS + 1, SAVE_INTERVAL))
    assert {step: reason for step, (reason, _) in run.checkpoints.items()} == dict.fromkeys(
        steps, ""
    ), run.checkpoints
    # The loss-aware sampler's history went on from the resumed checkpoint's: one loss per
    # trained sample between checkpoints (a history lost in the restart would count fewer).
    counts = [run.checkpoints[step][1] for step in steps]
    assert [b - a for a, b in itertools.pairwise(counts)] == [SAVE_INTERVAL * BATCH] * (
        len(steps) - 1
    ), counts
    print(
        f"\nkilled node {run.lost.ip} (rank 0's) at step {run.last_step_before}; resumed from "
        f"checkpoint {resumed_at} in the bucket; steps redone: {run.last_step_before - resumed_at}"
    )


def test_sampling_on_two_actors_writes_its_samples_to_the_bucket(
    netns_cluster: NetnsCluster, lost_node_run
) -> None:
    """`raydiff sample` from the run's last checkpoint in the bucket, on two actors (wherever the
    cluster has room: each downloads the checkpoint to its node's own disk), writes the npz,
    one PNG per image, the grid and sampling.json to the bucket."""
    checkpoint = f"{lost_node_run.uri}/checkpoint_{MAX_STEPS:06d}"
    out = f"s3://{netns_cluster.bucket}/samples/lost-node"
    done = netns_cluster.driver(
        [
            *("raydiff", "sample", "--checkpoint", checkpoint, "--out", out),
            *("--num-samples", "8", "--batch-size", "4", "--timestep-respacing", "4"),
            *("--num-workers", "2", "--address", netns_cluster.address),
        ],
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    keys = netns_cluster.keys("samples/lost-node/")
    images = {f"samples/lost-node/images/sample_{i:06d}.png" for i in range(8)}
    expected = {"samples_8x16x16x1.npz", "grid.png", "sampling.json"}
    assert images | {f"samples/lost-node/{name}" for name in expected} <= keys, sorted(keys)
