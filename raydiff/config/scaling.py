"""The scaling section: how a run is spread over Ray (workers, resources, failure handling)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raydiff.config.field_values import invalid

WorkerCount = int | tuple[int, int]
"""``scaling.num_workers``: a fixed number of workers, or ``(min, max)`` for an elastic run."""


def parse_worker_count(value: Any) -> WorkerCount:
    """``2``, ``"2"``, ``"1-4"``, ``[1, 4]`` or ``"[1, 4]"`` (YAML, JSON, ``--set`` and
    ``--num-workers``) -> ``2`` or ``(1, 4)``; ValueError for anything else. A range of one size
    is that size."""
    if isinstance(value, str):
        text = value.strip().strip("[]()").replace(" ", "")
        parts = text.split(",") if "," in text else text.split("-")
        value = parts[0] if len(parts) == 1 else parts
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise ValueError("expected N or MIN-MAX")
        low, high = (_whole(v) for v in value)
        return low if low == high else (low, high)
    return _whole(value)


def _whole(value: Any) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and value % 1):
        raise ValueError("expected N or MIN-MAX")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError("expected N or MIN-MAX") from None


@dataclass(kw_only=True, frozen=True)
class ScalingConfig:
    """How the run is spread over Ray: workers, resources, failure handling."""

    num_workers: WorkerCount = 2
    """Training workers (DDP ranks): N, or MIN-MAX ([MIN, MAX] in YAML) for an elastic run that
    Ray Train resizes between MIN and MAX workers as nodes come and go."""
    use_gpu: bool = False
    """One GPU per worker (NCCL) instead of CPU workers (gloo)."""
    cpus_per_worker: float = 1.0
    """CPUs reserved per worker; leave some CPUs free for Ray Data's decoding."""
    max_failures: int = 3
    """Worker-group restarts from the last checkpoint before the run fails (-1: unlimited)."""
    max_preemption_failures: int = -1
    """Restarts after a preemption (a node drained by its cloud or Kubernetes), counted apart
    from max_failures (-1: unlimited)."""
    preemption_check_interval: int = 1
    """Steps between checks for a preemption notice, on which the run checkpoints at once and
    waits for its restart (a barrier of all workers: ~2-7 ms on a CPU cluster; 0: never)."""
    resize_check_interval_s: float = 60.0
    """Seconds between an elastic run's checks for added capacity (a resize restarts the group
    from its last checkpoint: keep it well above save_interval's time)."""
    checkpoints_to_keep: int = 3
    """Newest checkpoints kept in run storage."""
    sampler_refresh_interval: int = 10
    """Steps between loss-aware sampler weight refreshes (all ranks switch together)."""

    def __post_init__(self) -> None:
        s = "scaling"
        try:
            # Every spelling ("1-4", [1, 4]) becomes one value; a frozen dataclass sets it so.
            object.__setattr__(self, "num_workers", parse_worker_count(self.num_workers))
        except ValueError as err:
            raise invalid(s, "num_workers", self.num_workers, str(err)) from None
        if self.min_workers < 1:
            raise invalid(s, "num_workers", self.num_workers, "must be >= 1 (every size)")
        if self.min_workers > self.max_workers:
            raise invalid(
                s,
                "num_workers",
                self.num_workers,
                f"the minimum {self.min_workers} is above the maximum {self.max_workers}",
            )
        if self.cpus_per_worker <= 0:
            raise invalid(s, "cpus_per_worker", self.cpus_per_worker, "must be > 0")
        for name in ("max_failures", "max_preemption_failures"):
            if getattr(self, name) < -1:
                raise invalid(s, name, getattr(self, name), "must be >= 0, or -1 for unlimited")
        if self.preemption_check_interval < 0:
            raise invalid(
                s,
                "preemption_check_interval",
                self.preemption_check_interval,
                "must be >= 0 (0: never)",
            )
        if self.resize_check_interval_s < 0:
            raise invalid(
                s, "resize_check_interval_s", self.resize_check_interval_s, "must be >= 0"
            )
        for name in ("checkpoints_to_keep", "sampler_refresh_interval"):
            if getattr(self, name) < 1:
                raise invalid(s, name, getattr(self, name), "must be >= 1")

    @property
    def min_workers(self) -> int:
        """The fewest workers the run trains on (``num_workers`` when it is fixed)."""
        return self.num_workers[0] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def max_workers(self) -> int:
        """The most workers the run trains on: what resources are sized for."""
        return self.num_workers[1] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def worker_sizes(self) -> range:
        """Every size the worker group may have."""
        return range(self.min_workers, self.max_workers + 1)
