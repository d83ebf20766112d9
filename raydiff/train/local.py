"""One process, no Ray: the runtime of ``raydiff train --single-process`` (and the benchmarks).

The data is the prepared dataset decoded into memory; checkpoints are written atomically into
the run folder (the same ``checkpoint_NNNNNN`` layout as a Ray run, so either kind of run can
continue the other).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch

from raydiff.config import ExperimentConfig
from raydiff.core.gaussian_diffusion import GaussianDiffusion
from raydiff.core.timestep_sampler import ScheduleSampler, create_named_schedule_sampler
from raydiff.data.in_memory import infinite_batches, load_split_tensors
from raydiff.data.manifest import Manifest, load_manifest
from raydiff.errors import UserInputError
from raydiff.storage import StoragePath, resolve_location
from raydiff.tracking import start_tracking
from raydiff.train.checkpoint import save_checkpoint
from raydiff.train.data_position import DataPosition
from raydiff.train.loop import run_loop
from raydiff.train.preflight import plan_start
from raydiff.train.run_lock import run_lock
from raydiff.train.runtime import Batch, CheckpointFiles, ValBatches

logger = logging.getLogger(__name__)


class LocalRuntime:
    """Rank 0 of 1. ``images``/``labels``: the training split in memory (float32 [N, C, H, W] in
    [-1, 1]; int64 [N] or None); ``val``: the validation split's images and labels, or None."""

    rank = 0
    world_size = 1
    is_main = True

    def __init__(
        self,
        config: ExperimentConfig,
        *,
        output_dir: StoragePath,
        resume: StoragePath | None,
        images: torch.Tensor,
        labels: torch.Tensor | None,
        val: tuple[torch.Tensor, torch.Tensor | None] | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.config = config
        self.output_dir = output_dir
        self.resume = resume
        self.images, self.labels, self.val = images, labels, val
        self.num_val_images = 0 if val is None else len(val[0])
        self.device = device or torch.device("cpu")
        self.last_checkpoint: StoragePath | None = None

    def resume_from(self) -> StoragePath | None:
        return self.resume

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self.device)

    def schedule_sampler(
        self, diffusion: GaussianDiffusion, *, seed: int, fresh: bool
    ) -> ScheduleSampler:
        return create_named_schedule_sampler(
            self.config.train.schedule_sampler, diffusion, seed=seed
        )

    def train_batches(
        self, *, batch_size: int, position: DataPosition
    ) -> Iterator[tuple[int, Batch]]:
        return infinite_batches(
            self.images,
            self.labels,
            batch_size=batch_size,
            seed=self.config.data.seed,
            start_epoch=position.epoch,
            skip_batches=position.batches,
            random_flip=self.config.data.random_flip,
        )

    def val_batches(self, *, rows: range, batch_size: int) -> ValBatches:
        if self.val is None:
            return []
        images, labels = self.val
        stop = min(rows.stop, len(images))
        out = []
        for start in range(rows.start, stop, batch_size):
            end = min(start + batch_size, stop)
            cond = {"y": labels[start:end].to(self.device)} if labels is not None else {}
            out.append((images[start:end].to(self.device), cond))
        return out

    def all_reduce_sum(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return values

    def preemption_notice(self, *, step: int) -> str | None:
        return None  # a single process has no cluster to be preempted from

    def await_preemption(self) -> None:
        raise RuntimeError("a single-process run receives no preemption notice")

    def report(
        self, metrics: dict[str, Any], *, step: int, checkpoint: CheckpointFiles | None
    ) -> None:
        if checkpoint is not None:
            self.last_checkpoint = save_checkpoint(self.output_dir, step, **checkpoint())
            logger.info("saved %s", self.last_checkpoint)


def single_process_device(config: ExperimentConfig) -> torch.device:
    """The device ``scaling.use_gpu`` asks for: the current CUDA device, else the CPU; refused
    in one line when it asks for a GPU that this machine does not have."""
    if not config.scaling.use_gpu:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserInputError(
            "scaling.use_gpu=true, but torch sees no CUDA GPU here (torch "
            f"{torch.__version__}, CUDA build {torch.version.cuda or 'none'}): drop "
            "scaling.use_gpu to train on the CPU"
        )
    return torch.device("cuda", torch.cuda.current_device())


def run_single_process(
    config: ExperimentConfig,
    *,
    output_dir: str | StoragePath,
    resume: str | StoragePath | None = None,
    manifest: Manifest | None = None,
    device: torch.device | None = None,
) -> dict[str, Any]:
    """Train ``config`` in this process on its prepared dataset; returns the final metrics.

    Runs the same checks as a Ray run first (:func:`raydiff.train.preflight.plan_start`); a run
    already at ``train.max_steps`` returns at once. Continues ``resume``, else the newest complete
    checkpoint under ``output_dir``. ``device``: default the GPU with ``scaling.use_gpu`` (as a
    Ray run's workers), else the CPU.
    """
    device = device or single_process_device(config)
    output_dir = resolve_location(output_dir)  # a local folder (absolute) or a URI
    manifest = manifest or load_manifest(config.data.data_dir)
    # One process trains the whole batch: scaling.num_workers does not apply.
    start = plan_start(
        config, output_dir=output_dir, resume=resume, manifest=manifest, num_workers=1
    )
    if start.finished is not None:
        return start.finished
    with run_lock(output_dir):  # one driver per run folder, as a Ray run
        start_tracking(config, run_dir=output_dir)  # the tracked runs a Ray run would continue
        data = config.data
        labels_wanted = config.model.class_cond
        images, labels, _ = load_split_tensors(data.data_dir, data.train_split, manifest=manifest)
        val = None
        if data.val_split and data.val_split in manifest.splits:
            val_images, val_labels, _ = load_split_tensors(
                data.data_dir, data.val_split, limit=config.train.eval_num_images, manifest=manifest
            )
            val = (val_images, val_labels if labels_wanted else None)
        runtime = LocalRuntime(
            config,
            output_dir=output_dir,
            resume=start.checkpoint,
            images=images,
            labels=labels if labels_wanted else None,
            val=val,
            device=device,
        )
        result = run_loop(config, runtime=runtime, output_dir=output_dir)
        result["checkpoint"] = str(runtime.last_checkpoint or start.checkpoint)
    result["output_dir"] = str(output_dir)
    return result
