"""The run's failures and preemptions as counted in Ray Train's controller
(``raydiff.orchestrate.metrics.RunEventMetrics``), without Ray: the callback is called as the
controller calls it, and its gauges are replaced by recorders. A real Prometheus reads them in
tests/integration/test_dashboard_prometheus.py."""

from __future__ import annotations

import pytest
from ray.exceptions import RayActorError

from raydiff.orchestrate import metrics
from raydiff.orchestrate.metrics import RunEventMetrics, metric_names
from raydiff.train.tasks import task_specs


class Recorder:
    """A gauge that keeps what was set (``_gauge``'s stand-in)."""

    def __init__(self, name: str, description: str, tags: dict[str, str]) -> None:
        self.name, self.description, self.tags = name, description, tags
        self.values: list[float] = []

    def set(self, value: float) -> None:
        self.values.append(value)


@pytest.fixture
def gauges(monkeypatch: pytest.MonkeyPatch) -> dict[str, Recorder]:
    made: dict[str, Recorder] = {}

    def record(name: str, description: str, tags: dict[str, str]) -> Recorder:
        made[name] = Recorder(name, description, tags)
        return made[name]

    monkeypatch.setattr(metrics, "_gauge", record)
    return made


def lost_worker(*, preempted: bool) -> RayActorError:
    return RayActorError(error_msg="the actor died", preempted=preempted)


def last(gauges: dict[str, Recorder]) -> dict[str, float]:
    return {name: gauge.values[-1] for name, gauge in gauges.items()}


def test_a_run_without_faults_exports_zeros_at_its_first_report(gauges) -> None:
    events = RunEventMetrics("run-a")
    assert not gauges  # made in the controller, at first use: nothing is pickled with them
    events.after_report(run_context=None, metrics=[{"step": 2}], checkpoint=None)
    assert last(gauges) == {"failures": 0, "preemptions": 0}
    assert {g.tags["run"] for g in gauges.values()} == {"run-a"}


def test_each_failed_worker_group_counts_once_and_preemptions_apart(gauges) -> None:
    events = RunEventMetrics("run-b")
    events.after_exception(run_context=None, worker_exceptions={1: ValueError("boom")})
    events.after_report(run_context=None, metrics=[{}], checkpoint=None)
    events.after_exception(run_context=None, worker_exceptions={0: lost_worker(preempted=False)})
    assert last(gauges) == {"failures": 2, "preemptions": 0}
    # The controller polls the stopping group again while the preempted node drains: one.
    for _ in range(3):
        events.after_exception(
            run_context=None,
            worker_exceptions={0: lost_worker(preempted=True), 1: ValueError("peer gone")},
        )
    assert last(gauges) == {"failures": 2, "preemptions": 1}
    events.after_report(run_context=None, metrics=[{}], checkpoint=None)  # the next group runs
    events.after_exception(run_context=None, worker_exceptions={1: lost_worker(preempted=True)})
    assert last(gauges) == {"failures": 2, "preemptions": 2}


def test_a_failure_after_a_preemption_is_counted_as_a_failure(gauges) -> None:
    events = RunEventMetrics("run-c")
    events.after_exception(run_context=None, worker_exceptions={0: lost_worker(preempted=True)})
    events.after_exception(run_context=None, worker_exceptions={0: ValueError("boom")})
    assert last(gauges) == {"failures": 1, "preemptions": 1}


def test_every_task_exports_the_run_events() -> None:
    for spec in task_specs().values():
        assert {"raydiff_failures", "raydiff_preemptions"} <= set(metric_names(spec))
