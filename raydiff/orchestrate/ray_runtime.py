"""A Ray Train worker as the one training loop's runtime (``raydiff.train.runtime.Runtime``).

Glue only. ``RayRuntime`` gives the loop this worker's rank, its Ray Data shards, DDP
(``prepare_model``: DDP when world size > 1), gloo/NCCL collectives, the run's loss-history actor
and ``ray.train.report`` (every rank reports at the same steps; only rank 0 attaches the
checkpoint). Resume works on any number of workers: every rank loads the same checkpoint files
itself, no collective is involved.
"""

from __future__ import annotations

import functools
import logging
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray.train
import ray.train.torch
import torch
import torch.distributed as dist

from raydiff.config import ExperimentConfig
from raydiff.core.gaussian_diffusion import GaussianDiffusion
from raydiff.core.timestep_sampler import ScheduleSampler, UniformSampler
from raydiff.data.cached_split import CachedSplit
from raydiff.data.pipeline import iterate_batches
from raydiff.orchestrate.loss_history_actor import ActorSyncedSampler
from raydiff.orchestrate.metrics import TrainingMetrics
from raydiff.storage import StoragePath
from raydiff.train.checkpoint import (
    checkpoint_name,
    latest_checkpoint,
    write_checkpoint_files,
)
from raydiff.train.data_position import DataPosition
from raydiff.train.runtime import Batch, CheckpointFiles, ValBatches
from raydiff.train.tasks import task_spec
from raydiff.train.validation import rank_slice

logger = logging.getLogger(__name__)


class RayRuntime:
    """A Ray Train worker as the loop's :class:`raydiff.train.runtime.Runtime`."""

    def __init__(
        self,
        config: ExperimentConfig,
        *,
        rank: int,
        world_size: int,
        output_dir: StoragePath,
        resume: StoragePath | None,
        num_val_images: int,
        cached_train: CachedSplit | None = None,
    ) -> None:
        self.config = config
        self.cached_train = cached_train
        self.rank, self.world_size = rank, world_size
        self.output_dir = output_dir
        self.resume = resume
        self.num_val_images = num_val_images
        self.device = ray.train.torch.get_device()
        self.sampler: ScheduleSampler | None = None
        # The dashboard's / Prometheus' view of the run (Ray's metrics), tagged with the Ray Train
        # run name; the figures are reduced over all workers already, so rank 0 alone exports.
        self.metrics = (
            TrainingMetrics(
                output_dir.name, task=task_spec(config.train.task), world_size=world_size
            )
            if rank == 0
            else None
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def resume_from(self) -> StoragePath | None:
        # The newest complete checkpoint in the run folder, else the one the driver chose at the
        # start (--resume). Not ray.train.get_checkpoint(): that is the last checkpoint Ray
        # Train recorded for the run (also one a driver started again on the folder inherits),
        # which may be a partial copy that cannot load (a crash mid-copy, a damaged file), or
        # older than a complete one it had not committed yet when the run failed or was stopped.
        newest = latest_checkpoint(self.output_dir)
        return newest if newest is not None else self.resume

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        # The UNet has no buffers, so DDP's buffer syncing is moot.
        return ray.train.torch.prepare_model(model)

    def schedule_sampler(
        self, diffusion: GaussianDiffusion, *, seed: int, fresh: bool
    ) -> ScheduleSampler:
        if self.config.train.schedule_sampler == "uniform":
            self.sampler = UniformSampler(diffusion, seed=seed)
            return self.sampler
        sampler = ActorSyncedSampler(
            diffusion,
            # The run's actor; where a restarted one reloads its history from (the driver
            # passes the same).
            run_dir=self.output_dir,
            rank=self.rank,
            seed=seed,
            refresh_interval=self.config.scaling.sampler_refresh_interval,
            broadcast=functools.partial(dist.broadcast, src=0) if self.world_size > 1 else None,
            resume_checkpoint=self.resume,
        )
        if fresh:
            # The actor outlives a worker group that failed before its first checkpoint.
            sampler.reset_history()
        self.sampler = sampler
        return sampler

    def train_batches(
        self, *, batch_size: int, position: DataPosition
    ) -> Iterator[tuple[int, Batch]]:
        if self.cached_train is not None:
            # This rank's slice of each global batch of one per-epoch order: the global batches
            # (and the position) do not depend on the number of workers.
            return self.cached_train.batches(
                global_batch=batch_size * self.world_size,
                config=self.config.data,
                rank=self.rank,
                world_size=self.world_size,
                epoch_start=position.epoch,
                skip_batches=position.batches,
            )
        # A streamed split: every rank skips the batches of the resumed epoch the run already trained on (per-rank
        # batches per epoch do not depend on the worker count: rows / global batch).
        return iterate_batches(
            ray.train.get_dataset_shard("train"),
            batch_size=batch_size,
            config=self.config.data,
            epoch_start=position.epoch,
            rank=self.rank,
            skip_batches=position.batches,
        )

    def val_batches(self, *, rows: range, batch_size: int) -> ValBatches:
        """``rows`` of the first ``eval_num_images`` validation rows. The driver limits the val
        dataset to those rows and does not split it: every rank reads them all, in order, and
        keeps its own ``rows`` (the same images at every evaluation)."""
        if not self.num_val_images or not rows:
            return []  # a rank with no rows to evaluate need not read the split
        batches = iterate_batches(
            ray.train.get_dataset_shard("val"),
            batch_size=batch_size,
            config=self.config.data,
            rank=self.rank,
            train=False,
        )
        return [
            (x.to(self.device), {k: v.to(self.device) for k, v in cond.items()})
            for x, cond in rank_slice((batch for _, batch in batches), rows=rows)
        ]

    def all_reduce_sum(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.world_size == 1:
            return values
        # One collective for everything: flatten, reduce, split back.
        keys = sorted(values)
        flat = [values[k].double().reshape(-1).to(self.device) for k in keys]
        packed = torch.cat(flat)
        dist.all_reduce(packed)
        sizes = [f.numel() for f in flat]
        return dict(zip(keys, torch.split(packed.cpu(), sizes), strict=True))

    def report(
        self, metrics: dict[str, Any], *, step: int, checkpoint: CheckpointFiles | None
    ) -> None:
        if self.metrics is not None:
            self.metrics.publish(metrics, sampler=self.sampler)
        if checkpoint is None:
            ray.train.report(metrics)
            return
        if isinstance(self.sampler, ActorSyncedSampler):
            # Every rank's losses up to this step go into the history rank 0 checkpoints: each
            # rank waits for its last record, then the barrier orders that before rank 0's read.
            self.sampler.wait_for_records()
            if self.world_size > 1:
                dist.barrier()
        with tempfile.TemporaryDirectory() as tmp:
            saved = None
            if self.is_main:
                write_checkpoint_files(Path(tmp), **checkpoint())
                saved = ray.train.Checkpoint.from_directory(tmp)
            # Ray copies the folder into run storage (file by file, not atomically) before
            # report returns; files.json, written last, tells a complete copy from a partial one
            # (raydiff.train.checkpoint).
            ray.train.report(metrics, checkpoint=saved, checkpoint_dir_name=checkpoint_name(step))

    def preemption_notice(self, *, step: int) -> str | None:
        interval = self.config.scaling.preemption_check_interval
        if interval == 0 or step % interval:
            return None
        # A barrier of all ranks (rank 0 broadcasts what Ray Train's preemption watcher saw):
        # every rank asks at the same steps.
        info = ray.train.get_preemption_info()
        if info is None:
            return None
        deadline = (
            f"by {time.strftime('%H:%M:%S', time.localtime(info.deadline_ms / 1000))}"
            if info.deadline_ms
            else "with no deadline given"
        )
        nodes = ", ".join(node[:12] for node in sorted(info.preempted_node_ids))
        ranks = ", ".join(map(str, sorted(info.preempted_ranks)))
        return f"node(s) {nodes} (ranks {ranks}) will be taken away {deadline}"

    def await_preemption(self) -> None:
        # Steps trained now would be lost with the group (Ray Train restarts it from the
        # checkpoint just saved), and a collective with the preempted ranks would fail once
        # their node goes: idle until Ray Train stops this group (at the node's loss or its
        # drain deadline).
        while True:
            time.sleep(1.0)
