"""A run's PyTorch process group: rendezvous from Ray Train's controller, joined by the workers'
train function (:func:`join_process_group`).

Ray Train's ``TorchConfig`` lives in ``ray.train.torch.config``, which imports torch at module
level. The run's controller unpickles the backend config it is given, so with ``TorchConfig``
every run's controller process imports torch (2.6 s here) before it starts the worker group, and
every worker imports torch and joins the process group before its train function starts: both
on the start-up path of every run and sweep trial. With :class:`TorchRendezvous` the controller
only publishes the rendezvous on the workers (torchrun's environment variables: rank 0's address
and a free port there, ranks, world size; no torch), and the train function joins the group once
it has asked for its data shard, so Ray Data's split coordinator starts while the worker imports
torch (``raydiff.orchestrate.worker``).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import ray
from ray.exceptions import GetTimeoutError
from ray.train._internal.utils import get_address_and_port
from ray.train.backend import Backend, BackendConfig

logger = logging.getLogger(__name__)

COLLECTIVE_TIMEOUT_S = 1800.0
"""How long a collective may wait for the other ranks before it fails (Ray's default)."""
SHUTDOWN_TIMEOUT_S = 30.0
"""How long the controller waits for the workers to leave their process group."""


@dataclass
class TorchRendezvous(BackendConfig):
    """The backend config of raydiff's Ray Train runs (``DataParallelTrainer(backend_config=)``)."""

    @property
    def backend_cls(self) -> type[Backend]:
        return _Rendezvous

    # No ``framework`` (Ray's TorchConfig says TORCH): with one, Ray Train's state tracking (the
    # dashboard's Train page) has worker 0 import torch before the train function and hands
    # torch.__version__, a torch class, to the controller, which imports torch to unpickle it.
    # The Train page shows the run without its torch version.

    def to_dict(self) -> dict[str, Any]:
        return {"init_method": "env"}


class _Rendezvous(Backend):
    """The controller's half, run whenever Ray Train starts a worker group (restarts too)."""

    # Every worker on a node sees all of that node's GPUs the run holds (as with Ray's own torch
    # backend); each one takes its own through ray.train.torch.get_device().
    share_cuda_visible_devices = True

    def on_start(self, worker_group: Any, backend_config: TorchRendezvous) -> None:
        # Rank 0's node address and a free port there (Ray's own torch backend's helper).
        address, port = worker_group.execute_single(0, get_address_and_port)
        world_size = len(worker_group)
        ray.get(
            [
                worker_group.execute_single_async(
                    rank, _publish_rendezvous, address=address, port=port, world_rank=rank
                )
                for rank in range(world_size)
            ]
        )

    def on_shutdown(self, worker_group: Any, backend_config: TorchRendezvous) -> None:
        refs = worker_group.execute_async(_leave_process_group)
        try:
            ray.get(refs, timeout=SHUTDOWN_TIMEOUT_S)
        except GetTimeoutError:
            logger.warning(
                "the workers did not leave their process group in %.0f s", SHUTDOWN_TIMEOUT_S
            )


# The functions below run on the training workers.


def _publish_rendezvous(*, address: str, port: int, world_rank: int) -> None:
    import ray.train

    context = ray.train.get_context()
    # torchrun's variables: init_method="env://" reads them, as do libraries built on
    # torch.distributed.
    os.environ.update(
        MASTER_ADDR=address,
        MASTER_PORT=str(port),
        RANK=str(world_rank),
        WORLD_SIZE=str(context.get_world_size()),
        LOCAL_RANK=str(context.get_local_rank()),
        LOCAL_WORLD_SIZE=str(context.get_local_world_size()),
        NODE_RANK=str(context.get_node_rank()),
    )


def join_process_group(*, use_gpu: bool, timeout_s: float = COLLECTIVE_TIMEOUT_S) -> None:
    """Join the run's process group (the train function, on every worker, before any
    collective): NCCL on the worker's GPU when the run has GPUs, gloo otherwise."""
    import ray.train.torch
    import torch
    import torch.distributed as dist

    if use_gpu:
        device = ray.train.torch.get_device()
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL works on the current device
        if "TORCH_NCCL_BLOCKING_WAIT" not in os.environ:
            # A collective that times out raises (and Ray Train restarts the workers) instead
            # of hanging.
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    dist.init_process_group(
        backend="nccl" if use_gpu else "gloo",
        init_method="env://",
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timedelta(seconds=timeout_s),
    )


def _leave_process_group() -> None:
    torch = sys.modules.get("torch")
    if torch is None:  # the train function failed before it imported torch: nothing to leave
        return
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
