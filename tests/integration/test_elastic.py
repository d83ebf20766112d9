"""Elastic, preemptible training on a real multi-node Ray cluster: the ``elastic`` tier.

One elastic run (``scaling.num_workers=1-2``, one training worker per worker node, the training
split in the decoded cache) meets three faults in turn, on the multi-node cluster and with the
driver of ``tests/integration/test_faults.py`` (see there for the cluster, the driver and how
steps and recovery are measured):

1. a worker node is removed (killed): the run continues on one worker;
2. a worker node is added: Ray Train grows the group back to two workers
   (``scaling.resize_check_interval_s=5``);
3. a preemption notice: a worker node is drained the way a cloud or Kubernetes drains it
   (``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION`` with a 2 s deadline, the node left
   to go by itself): the run checkpoints at once and continues on the node that is left.

``scaling.max_failures=1``: the lost node uses the one failure allowed, so the run only finishes
because the preemption is counted apart (``scaling.max_preemption_failures``) and a resize not at
all. Then the loss of every step (TensorBoard's curve, restarts resolved) is compared with a
single-process run of the same config: the same global batches and draws at every worker count,
so they agree to the rounding of the gradient all-reduce.

Ray Train's preemption watcher is on here (``test_faults.py`` turns it off) and polls every
0.5 s. ``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S=10``: after a node is lost, Ray Train counts its
resources for up to ~20 s more and first tries the old size, which waits for this timeout (60 s
by default) before it starts the smaller group. About three minutes on the 2-core VM, so not in
``make test``: ``make test-elastic``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_faults import (
    NODE_CPUS,
    REPO,
    SAVE_INTERVAL,
    TINY_RUN,
    Driver,
    FaultCluster,
    Recovery,
    Step,
    cluster_env,
    current_group,
    driver,
    fault_cluster,  # noqa: F401 -- the module's cluster (a fixture)
    recovery,
    report,
)
from test_job_submit import train_arguments

MAX_STEPS = 200
ELASTIC_RUN = [
    "scaling.num_workers=1-2",
    "scaling.resize_check_interval_s=5",
    "scaling.max_failures=1",
    "train.schedule_sampler=uniform",
    "optim.posthoc_ema_stds=0.05,0.10",  # the post-hoc EMA profiles through every restart
    "optim.posthoc_ema_interval=20",
    f"train.max_steps={MAX_STEPS}",
    "data.cache_max_bytes=1073741824",  # test_faults streams its data; cached here
]
ELASTIC_ENV = {
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "1",
    "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "0.5",
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "10",
}
GROUP = re.compile(
    r"pid=(?P<pid>\d+)[^)]*\)\s+\S+ \S+ \[rank 0\] raydiff\.train\.build: .*?; "
    r"(?P<size>\d+) worker\(s\)"
)
NOTICE = re.compile(r"\[rank 0\] raydiff\.train\.loop: preemption notice at step (?P<step>\d+)")


@dataclass
class Fault:
    """One injected fault and what the progress lines say about the recovery."""

    name: str
    injected: float
    recovery: Recovery
    size_before: int
    size_after: int

    @property
    def recovery_s(self) -> float:
        return self.recovery.first_step_after.time - self.injected


@dataclass
class ElasticRun:
    out: Path
    reference: Path  # the same config trained in a single process
    driver: Driver
    code: int
    faults: dict[str, Fault]
    notice_step: int | None


def group_sizes(run: Driver) -> dict[int, int]:
    """Each worker group's size, by its rank 0's pid."""
    return {int(m["pid"]): int(m["size"]) for m in GROUP.finditer(run.text())}


def inject(name: str, run: Driver, action: Any) -> Fault:
    """Do ``action`` to the running worker group, wait for the next group's first steps and
    measure the recovery."""
    rank0 = run.steps()[-1].pid
    seen = {s.pid for s in run.steps()}
    injected = time.time()
    action()

    def new_steps() -> list[Step]:
        return [s for s in run.steps() if s.pid not in seen]

    run.wait_for(lambda: len({s.step for s in new_steps()}) >= 2, f"recovery from {name}")
    after = new_steps()
    before = [s for s in run.steps() if s.pid == rank0]  # steps logged until the group stopped
    sizes = group_sizes(run)
    return Fault(
        name=name,
        injected=injected,
        recovery=recovery(before, after),
        size_before=sizes[rank0],
        size_after=sizes[after[0].pid],
    )


def drain_for_preemption(cluster: FaultCluster, node_id: str) -> None:
    """What a cloud's or Kubernetes' node shutdown makes Ray do: drain the node with reason
    PREEMPTION and a deadline (Ray's hidden ``ray drain-node`` command); the node is left to go
    by itself (its raylet exits once Ray Train has stopped the workers on it)."""
    ray_cli = Path(sys.executable).with_name("ray")
    subprocess.run(
        [
            str(ray_cli if ray_cli.exists() else shutil.which("ray")),
            "drain-node",
            "--address",
            cluster.address,
            "--node-id",
            node_id,
            "--reason",
            "DRAIN_NODE_REASON_PREEMPTION",
            "--reason-message",
            "raydiff fault suite: preemption",
            "--deadline-remaining-seconds",
            "2",
        ],
        env=cluster_env(),
        check=True,
        capture_output=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def elastic_run(fault_cluster, tiny_dataset, tmp_path_factory) -> ElasticRun:  # noqa: F811
    fault_cluster.shape(NODE_CPUS, NODE_CPUS)
    root = tmp_path_factory.mktemp("elastic")
    out, reference = (root / "elastic").resolve(), (root / "reference").resolve()
    faults: dict[str, Fault] = {}
    args = (fault_cluster, tiny_dataset.path, out, *ELASTIC_RUN)
    with driver(*args, name="elastic", env=ELASTIC_ENV) as run:
        run.wait_for_step(SAVE_INTERVAL + 2, after_checkpoint=SAVE_INTERVAL)
        _, other = current_group(fault_cluster, run)
        lost = fault_cluster.node_of(other)
        faults["removed"] = inject(
            "a worker node removed", run, lambda: fault_cluster.remove(lost, graceful=False)
        )
        faults["added"] = inject(
            "a worker node added", run, lambda: fault_cluster.request("add", cpus=[NODE_CPUS])
        )
        _, other = current_group(fault_cluster, run)
        drained = fault_cluster.node_of(other)
        faults["preempted"] = inject(
            "a preemption notice (node drained)",
            run,
            lambda: drain_for_preemption(fault_cluster, drained.node_id),
        )
        code = run.finish()
    notice = NOTICE.search(run.text())
    reference_run = subprocess.run(
        [
            sys.executable,
            # Its checkpoints are not compared: one, at the end.
            *train_arguments(
                tiny_dataset.path,
                reference,
                *TINY_RUN,
                *ELASTIC_RUN,
                f"train.save_interval={MAX_STEPS}",
            ),
            "--single-process",
        ],
        cwd=REPO,
        env=cluster_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert reference_run.returncode == 0, reference_run.stderr[-3000:]
    return ElasticRun(
        out=out,
        reference=reference,
        driver=run,
        code=code,
        faults=faults,
        notice_step=int(notice["step"]) if notice else None,
    )


def report_fault(fault: Fault, **extra: Any) -> None:
    report(
        {
            "fault": f"elastic 1-2: {fault.name}",
            "resumed_from": f"checkpoint_{fault.recovery.resumed_at:06d}",
            "steps_redone": fault.recovery.redone,
            "recovery_s": round(fault.recovery_s, 1),
            "workers": f"{fault.size_before} -> {fault.size_after}",
            **extra,
        }
    )


def test_a_node_removed_the_run_continues_on_fewer_workers(elastic_run):
    run = elastic_run
    assert run.code == 0, run.driver.text()[-4000:]
    fault = run.faults["removed"]
    assert (fault.size_before, fault.size_after) == (2, 1), fault
    assert 0 <= fault.recovery.redone <= SAVE_INTERVAL, fault
    report_fault(fault)


def test_a_node_added_the_group_grows_back(elastic_run):
    run = elastic_run
    fault = run.faults["added"]
    assert (fault.size_before, fault.size_after) == (1, 2), fault
    assert 0 <= fault.recovery.redone <= SAVE_INTERVAL, fault
    report_fault(fault)


def test_a_preemption_notice_checkpoints_at_once(elastic_run):
    """The notice's step is checkpointed and the next group starts from it: no step redone.
    The run had used its one failure (the removed node), so it finished only because the
    preemption was counted apart."""
    run = elastic_run
    assert run.code == 0, run.driver.text()[-4000:]
    fault = run.faults["preempted"]
    assert run.notice_step is not None, run.driver.text()[-4000:]
    assert fault.recovery.resumed_at == run.notice_step, (fault, run.notice_step)
    assert fault.recovery.redone <= 1, fault
    assert (run.out / f"checkpoint_{run.notice_step:06d}").is_dir()
    assert (fault.size_before, fault.size_after) == (2, 1), fault
    report_fault(fault, notice_at_step=run.notice_step)


def test_the_loss_history_matches_an_uninterrupted_run(elastic_run):
    """Every step's loss of the run that lost, gained and lost a node equals that of one process
    training the same config straight through (the same global batches and noise at any worker
    count), to the rounding of the gradient all-reduce."""
    import numpy as np

    elastic, reference = losses(elastic_run.out), losses(elastic_run.reference)
    assert sorted(elastic) == sorted(reference) == list(range(1, MAX_STEPS + 1))
    a = np.array([elastic[s] for s in sorted(elastic)])
    b = np.array([reference[s] for s in sorted(reference)])
    relative = np.abs(a - b) / np.abs(b)
    print(
        f"\nloss per step, elastic run vs one process, {MAX_STEPS} steps: largest relative "
        f"difference {relative.max():.2e} (step {int(relative.argmax()) + 1}), median "
        f"{np.median(relative):.2e}"
    )
    report(
        {
            "fault": "elastic run vs uninterrupted: loss per step",
            "max_rel_diff": f"{relative.max():.1e}",
        }
    )
    np.testing.assert_allclose(a, b, rtol=1e-3)


def test_the_post_hoc_ema_snapshots_match_an_uninterrupted_run(elastic_run):
    """The power-function EMA profiles live in the checkpoint: through the lost node, the new
    node and the preemption the run writes every snapshot one process writes, as close to it as
    the two runs' final weights are to each other (the gradient all-reduce rounds differently on
    2 workers than in one process) plus the fp16 rounding of a snapshot."""
    import torch

    names = sorted(p.name for p in (elastic_run.reference / "posthoc_ema").iterdir())
    assert names == [f"snapshot_{s:07d}.pt" for s in range(20, MAX_STEPS + 1, 20)]
    assert sorted(p.name for p in (elastic_run.out / "posthoc_ema").iterdir()) == names
    final = f"checkpoint_{MAX_STEPS:06d}/model.pt"
    weights = relative_difference(
        torch.load(elastic_run.out / final, weights_only=True),
        torch.load(elastic_run.reference / final, weights_only=True),
    )
    largest = 0.0
    for name in names:
        a = torch.load(elastic_run.out / "posthoc_ema" / name, weights_only=True)["profiles"]
        b = torch.load(elastic_run.reference / "posthoc_ema" / name, weights_only=True)
        assert a.keys() == b["profiles"].keys() == {"0.050", "0.100"}
        for sigma, profile in a.items():
            largest = max(largest, relative_difference(profile, b["profiles"][sigma]))
    print(
        f"\npost-hoc EMA snapshots, elastic run vs one process: largest relative difference "
        f"{largest:.1e} (final weights: {weights:.1e})"
    )
    assert largest <= weights + 1e-3


def relative_difference(a: dict, b: dict) -> float:
    """||a - b|| / ||b|| over every floating-point tensor of two state dicts."""
    keys = [k for k, v in b.items() if v.is_floating_point()]
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in keys)
    den = sum(float(b[k].double().pow(2).sum()) for k in keys)
    return (num / den) ** 0.5


def losses(run_dir: Path) -> dict[int, float]:
    """``train/loss`` per step as TensorBoard shows it (steps a restart redid replaced)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {e.step: e.value for e in events.Scalars("train/loss")}
