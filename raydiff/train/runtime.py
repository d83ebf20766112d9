"""What the one training loop needs from where it runs: rank, data, collectives, checkpoints.

:func:`raydiff.train.loop.run_loop` is written against this interface only (and against
:class:`raydiff.train.task.Task` for what it trains). Two implementations:

* :class:`raydiff.train.local.LocalRuntime`: one process, in-memory data, no collectives,
  checkpoints written atomically into the run folder (``raydiff train --single-process``);
* ``raydiff.orchestrate.ray_runtime.RayRuntime``: a Ray Train worker (DDP, Ray Data shard, the
  loss-history actor, ``ray.train.report``).

Contract for the loop: every rank calls :meth:`Runtime.report` and
:meth:`Runtime.preemption_notice` at the same steps (on Ray they are barriers and must be called
the same number of times everywhere), and the checkpoint files function handed to ``report`` is
called on the main rank only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from raydiff.core.gaussian_diffusion import GaussianDiffusion
from raydiff.core.timestep_sampler import ScheduleSampler
from raydiff.storage import StoragePath
from raydiff.train.data_position import DataPosition

Batch = dict[str, Any]
"""``x`` float32 [B, C, H, W] in [-1, 1], ``index`` int64 [B], ``y`` int64 [B] when labelled;
in a task's ``losses``, also ``noise`` (like ``x``): the step's standard normal draw for these
rows, the noise of ``q_sample``, and ``augment_seed`` (int64 [B], on the CPU): a seed per row
for a task's random augmentations, keyed by the row's place in the global batch, so that they do
not depend on the number of workers or microbatches."""

ValBatches = list[tuple[torch.Tensor, dict[str, torch.Tensor]]]
"""Validation images on the device, with their labels (``y``) when the runtime was asked for
them."""

CheckpointFiles = Callable[[], dict[str, Any]]
"""Returns the keyword arguments of ``raydiff.train.checkpoint.write_checkpoint_files``."""


class Runtime(Protocol):
    """Where the loop runs. See the module docstring for the calling contract."""

    rank: int
    world_size: int
    device: torch.device
    num_val_images: int
    """Validation images :meth:`val_batches` can hand out: the first rows of the val split, at
    most ``train.eval_num_images`` (fewer when the split is smaller; 0 without a val split)."""

    @property
    def is_main(self) -> bool:
        """Rank 0: writes TensorBoard, sample grids, progress lines and checkpoints."""
        ...

    def resume_from(self) -> StoragePath | None:
        """The checkpoint folder to continue from, local or under a URI (None: fresh)."""
        ...

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Move ``model`` to the device and wrap it for data parallelism where needed."""
        ...

    def schedule_sampler(
        self, diffusion: GaussianDiffusion, *, seed: int, fresh: bool
    ) -> ScheduleSampler:
        """The run's timestep sampler (``fresh``: the run starts without a checkpoint)."""
        ...

    def train_batches(
        self, *, batch_size: int, position: DataPosition
    ) -> Iterator[tuple[int, Batch]]:
        """``(epoch, batch)`` of this rank forever, starting at ``position``."""
        ...

    def val_batches(self, *, rows: range, batch_size: int) -> ValBatches:
        """Validation images ``rows`` (of the first :attr:`num_val_images`, in the split's order),
        read ``batch_size`` at a time; rows past the last are left out ([] without a val
        split)."""
        ...

    def all_reduce_sum(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Element-wise sums over all ranks (identity on one)."""
        ...

    def report(
        self, metrics: dict[str, Any], *, step: int, checkpoint: CheckpointFiles | None
    ) -> None:
        """Publish ``metrics``; with ``checkpoint``, also save a checkpoint of ``step``."""
        ...

    def preemption_notice(self, *, step: int) -> str | None:
        """After each ``step``: what is being preempted when a node of this worker group is
        (the loop then checkpoints at once), else None. Every rank calls it after every step."""
        ...

    def await_preemption(self) -> None:
        """After the checkpoint of a preemption notice: wait, training nothing more, for the
        worker group to be stopped (it is restarted from that checkpoint)."""
        ...
