"""The loss-aware timestep sampler's history in one Ray actor shared by all training workers.

Why an actor: the history must outlive a worker restart and be identical for every rank. The
reference all-gathers (t, loss) every step with one ``.item()`` per element and loses the history
on every restart.

Protocol (off the step's critical path: a round trip from a Train worker to an actor takes
~1-2 ms on a 2-core machine, longer than a gloo all-gather of the same data):
- every rank sends its (t, loss) batch with a fire-and-forget ``record.remote``;
- every ``refresh_interval`` steps rank 0 pulls the weights and broadcasts them to the other
  ranks with one collective, so every rank switches to the same weights at the same step;
- before a checkpoint every rank waits for its last ``record`` (:meth:`ActorSyncedSampler.
  wait_for_records`, then a collective), so the history rank 0 fetches for the checkpoint holds
  every rank's losses up to that step;
- a worker group that starts without a checkpoint empties the history (rank 0, before the first
  step): a restart before the first checkpoint must not keep the failed attempt's losses; one
  that resumes loads the checkpointed history into the actor.

Actor failures are Ray's own actor restarts (``max_restarts``, ``max_task_retries=-1``), not code
of ours (what a user sees: docs/training.md, "Failures and resuming"). Ray re-runs ``__init__``
with its original arguments, which loads the history of the run's newest complete checkpoint in
``run_dir`` (else of ``resume_checkpoint``, where a ``--resume`` run started; else none), and
every handle stays valid. Calls made while the actor is down, or running when it died, are
retried on the new process (``ray.get`` waits meanwhile); fire-and-forget ``record`` calls too,
possibly in another order (the history is a per-t FIFO, so only which of a t's losses are the
newest 10 can differ). Losses recorded after the last checkpoint are lost. After
``MAX_RESTARTS`` deaths (a crash loop), or an ``__init__`` that raises, the next ``ray.get``
raises ``ActorDiedError``; the worker fails, and the worker group Ray Train restarts creates a
new actor under the freed name.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from raydiff.core.gaussian_diffusion import GaussianDiffusion
from raydiff.core.timestep_sampler import LossSecondMomentResampler, ScheduleSampler
from raydiff.storage import StoragePath, as_location, local_copy, resolve_location
from raydiff.train.checkpoint import latest_checkpoint

logger = logging.getLogger(__name__)

ACTOR_NAMESPACE = "raydiff"
#: Ray restarts a dead loss-history actor this many times in its lifetime (a few per run are
#: normal after a node or process failure); more means a crash loop, which should fail the run
#: (see the module docstring) rather than block rank 0's weights pull forever.
MAX_RESTARTS = 10


@ray.remote(num_cpus=0, max_restarts=MAX_RESTARTS, max_task_retries=-1)
class LossHistoryActor:
    """Holds a ``LossSecondMomentResampler``'s history; the math stays in raydiff.core.

    Every method is safe to retry (Ray retries calls that a restart interrupted): ``record``
    only ever runs once per process, and a restarted process starts from a checkpoint.
    """

    def __init__(
        self,
        num_timesteps: int,
        run_dir: StoragePath | None = None,
        resume_checkpoint: StoragePath | None = None,
    ) -> None:
        # Also what a restart re-runs (the module docstring); a uniform-sampler run's
        # checkpoint keeps no history.
        source = latest_checkpoint(run_dir) if run_dir else None
        if source is None and resume_checkpoint:
            source = as_location(resume_checkpoint)
        self._restored_from = source
        history = None
        if self._restored_from is not None:
            with local_copy(self._restored_from / "trainer.pt") as trainer_file:  # a URI's: fetched
                # mmap: only the sampler's tensors are read, not the optimiser state beside them.
                state = torch.load(trainer_file, map_location="cpu", weights_only=True, mmap=True)
                sampler_state = state.get("sampler", {})
                if "loss_history" in sampler_state:
                    history = {k: sampler_state[k].clone() for k in ("loss_history", "loss_counts")}
        self._sampler = history_sampler(num_timesteps, history)
        if self._restored_from is not None:
            logger.warning(
                "loss-history actor (pid %d) starts with the history of %s (%d losses)",
                os.getpid(),
                self._restored_from,
                int(self._sampler.state_dict()["loss_counts"].sum()),
            )

    def record(self, ts: np.ndarray, losses: np.ndarray) -> None:
        # Arguments arrive as read-only views of the object store: copy before torch wraps them.
        self._sampler.update_with_all_losses(torch.tensor(ts), torch.tensor(losses))

    def reset(self) -> None:
        """Forget every recorded loss (a run starting from scratch)."""
        self._sampler = history_sampler(self._sampler.num_timesteps)

    def weights(self) -> np.ndarray:
        return self._sampler.weights()

    def state_dict(self) -> dict[str, Any]:
        state = self._sampler.state_dict()
        return {"loss_history": state["loss_history"], "loss_counts": state["loss_counts"]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._sampler = history_sampler(self._sampler.num_timesteps, state)

    def info(self) -> dict[str, Any]:
        """This process's pid, the checkpoint its ``__init__`` loaded (None: started empty) and
        how many losses the history holds: what tells a restarted actor from the first one."""
        return {
            "pid": os.getpid(),
            "restored_from": None if self._restored_from is None else str(self._restored_from),
            "num_recorded": int(self._sampler.state_dict()["loss_counts"].sum()),
        }


def history_sampler(
    num_timesteps: int, history: dict[str, Any] | None = None
) -> LossSecondMomentResampler:
    """IDDPM's loss-second-moment sampler (10 losses per t, 0.1% uniform), empty or holding
    ``history`` (its ``loss_history`` and ``loss_counts``)."""
    sampler = LossSecondMomentResampler(_StepCount(num_timesteps), 10, 0.001)
    if history is not None:
        full = sampler.state_dict()
        full.update(loss_history=history["loss_history"], loss_counts=history["loss_counts"])
        sampler.load_state_dict(full)
    return sampler


class _StepCount:
    """Stands in for a diffusion where only ``num_timesteps`` is needed."""

    def __init__(self, num_timesteps: int) -> None:
        self.num_timesteps = num_timesteps


def actor_name(run_dir: str | os.PathLike[str] | StoragePath) -> str:
    """The name of the loss-history actor of the run in ``run_dir``: per run folder, not per
    folder name (two runs called "demo" in different places must not share, or kill, one
    history); the same for the driver, the workers and a sweep, whichever form they hold."""
    where = str(resolve_location(run_dir))
    return f"loss-history-{Path(where).name}-{hashlib.sha1(where.encode()).hexdigest()[:10]}"


def get_or_create_actor(
    run_dir: str | os.PathLike[str] | StoragePath,
    *,
    num_timesteps: int,
    resume_checkpoint: str | os.PathLike[str] | StoragePath | None = None,
) -> ray.actor.ActorHandle:
    """The named actor of the run in ``run_dir``, created if it does not exist (one per run).

    ``resume_checkpoint`` (where a restart reloads from while ``run_dir`` has no checkpoint) only
    takes effect when this call creates the actor, so the driver and the workers pass the same.
    """
    return LossHistoryActor.options(
        name=actor_name(run_dir),
        namespace=ACTOR_NAMESPACE,
        get_if_exists=True,
        lifetime="detached",
    ).remote(
        num_timesteps,
        # Absolute local paths (the actor runs elsewhere), or a URI's path with its filesystem
        # (credentials included: the actor may run where the environment has none).
        resolve_location(run_dir),
        None if resume_checkpoint is None else resolve_location(resume_checkpoint),
    )


def kill_actor(run_dir: str | os.PathLike[str] | StoragePath, *, timeout_s: float = 30.0) -> None:
    """Remove the run's actor for good (detached actors outlive the driver otherwise).

    Returns once Ray has released the actor's name (``ray.kill`` only asks for the kill), so that
    a run started next on the same folder creates a new actor instead of finding the dying one,
    and no call reaches the old one after this returns; after ``timeout_s`` it logs a warning.
    """
    name = actor_name(run_dir)
    try:
        actor = ray.get_actor(name, namespace=ACTOR_NAMESPACE)
    except ValueError:  # none (any more)
        return
    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=ACTOR_NAMESPACE)
        except ValueError:
            return
        time.sleep(0.05)
    logger.warning(
        "the loss-history actor %s was still registered %.0f s after it was killed", name, timeout_s
    )


class ActorSyncedSampler(ScheduleSampler):
    """The worker side: samples from weights pulled from the actor, identical on every rank.

    :param broadcast: broadcasts a float64 tensor from rank 0 to all ranks in place
        (``torch.distributed.broadcast``); ``None`` in a single process.
    :param run_dir, resume_checkpoint: see :func:`get_or_create_actor` (the same values as the
        driver's call).
    """

    def __init__(
        self,
        diffusion: GaussianDiffusion,
        *,
        run_dir: str | os.PathLike[str] | StoragePath,
        rank: int,
        seed: int,
        refresh_interval: int = 10,
        broadcast: Any = None,
        resume_checkpoint: str | os.PathLike[str] | StoragePath | None = None,
    ) -> None:
        super().__init__(diffusion.num_timesteps, seed=seed)
        self.rank = rank
        self.refresh_interval = refresh_interval
        self.broadcast = broadcast
        self.actor = get_or_create_actor(
            run_dir, num_timesteps=diffusion.num_timesteps, resume_checkpoint=resume_checkpoint
        )
        self._weights = np.ones(diffusion.num_timesteps, dtype=np.float64)
        self._steps_seen = 0
        self._pending: Any = None  # this rank's last record call

    def weights(self) -> np.ndarray:
        return self._weights

    def record_losses(self, ts: torch.Tensor, losses: torch.Tensor, *, sync: Any = None) -> None:
        """Send this rank's losses (no wait) and, every refresh_interval steps, switch weights."""
        self._pending = self.actor.record.remote(
            ts.detach().cpu().numpy(), losses.detach().cpu().double().numpy()
        )
        self._steps_seen += 1
        if self._steps_seen % self.refresh_interval == 0:
            self.refresh()

    def refresh(self) -> None:
        """All ranks take rank 0's view of the actor's weights (a collective: call on every rank)."""
        message = torch.from_numpy(self._weights.copy())
        if self.rank == 0:
            message = torch.tensor(
                np.asarray(ray.get(self.actor.weights.remote()), dtype=np.float64)
            )
        if self.broadcast is not None:
            self.broadcast(message)
        self._weights = message.numpy()

    def wait_for_records(self) -> None:
        """Block until the actor has processed this rank's last ``record`` (before a checkpoint).

        Through an actor restart this waits for the retried call; an actor that is dead for good
        raises ``ActorDiedError`` here (the worker group then restarts, see the module docstring).
        """
        if self._pending is not None:
            pending, self._pending = self._pending, None
            ray.get(pending)

    def reset_history(self) -> None:
        """A run starting without a checkpoint: rank 0 empties the actor's history (the actor is
        detached and outlives a failed worker group, so it may hold that attempt's losses)."""
        if self.rank == 0:
            ray.get(self.actor.reset.remote())

    def state_dict(self) -> dict[str, Any]:
        """rank 0: the actor's history plus this sampler's RNG, current weights and step count
        (a resumed run refreshes its weights at the same steps as the uninterrupted one)."""
        state = {
            **super().state_dict(),
            "weights": torch.from_numpy(self._weights.copy()),
            "steps_seen": self._steps_seen,
        }
        if self.rank == 0:
            state.update(ray.get(self.actor.state_dict.remote()))
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from a checkpoint's sampler state (every rank). Checkpoints of a
        single-process run carry the history but no ``weights``; those of a uniform-sampler run
        neither: the weights are then recomputed from the history (uniform without one)."""
        super().load_state_dict(state)
        self._steps_seen = int(state.get("steps_seen", 0))
        if "loss_history" in state:
            if self.rank == 0:
                history = {k: state[k] for k in ("loss_history", "loss_counts")}
                ray.get(self.actor.load_state_dict.remote(history))
        else:
            self.reset_history()
        if "weights" in state:
            self._weights = state["weights"].numpy().astype(np.float64)
        elif "loss_history" in state:  # the same on every rank: computed from the same state
            self._weights = history_sampler(self.num_timesteps, state).weights()
        else:
            self._weights = np.ones(self.num_timesteps, dtype=np.float64)
