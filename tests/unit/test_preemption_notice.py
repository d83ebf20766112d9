"""How a Ray worker asks for a preemption notice: the cadence and what it tells the log.

``ray.train.get_preemption_info`` is replaced by a recorder (it is a barrier of a real worker
group; the real notice, from a drained node, is the elastic tier's test,
tests/integration/test_elastic.py).
"""

from __future__ import annotations

import pytest

from raydiff.config import ExperimentConfig, apply_overrides


def runtime(interval: int):
    from raydiff.orchestrate.ray_runtime import RayRuntime

    rt = object.__new__(RayRuntime)  # no Ray Train context here: only the fields the call reads
    rt.config = apply_overrides(
        ExperimentConfig(), [f"scaling.preemption_check_interval={interval}"]
    )
    return rt


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    import ray.train

    calls: list[int] = []
    info = ray.train.PreemptionInfo(
        deadline_ms=None, preempted_node_to_ranks={"a1b2c3d4e5f6a7b8c9d0": [1, 2]}
    )

    def notice() -> ray.train.PreemptionInfo | None:
        calls.append(1)
        return info if len(calls) >= 2 else None

    monkeypatch.setattr(ray.train, "get_preemption_info", notice)
    return calls


def test_every_rank_asks_at_the_same_steps_and_is_told_what_goes(asked):
    rt = runtime(interval=3)
    answers = {step: rt.preemption_notice(step=step) for step in range(1, 7)}
    assert len(asked) == 2  # steps 3 and 6 only: a step count, the same on every rank
    assert answers[3] is None and answers[1] is None
    assert (
        answers[6] == "node(s) a1b2c3d4e5f6 (ranks 1, 2) will be taken away with no deadline given"
    )


def test_interval_zero_never_asks(asked):
    rt = runtime(interval=0)
    assert all(rt.preemption_notice(step=step) is None for step in range(1, 10))
    assert asked == []
