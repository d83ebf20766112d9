"""The loss-aware timestep sampler's history in one Ray actor shared by all training workers.

Why an actor: the history must outlive a worker restart and be identical for every rank. The
reference all-gathers (t, loss) every step with one ``.item()`` per element and loses the history
on every restart.

Protocol (off the step's critical path, see ray-notes.md: an actor round trip is ~2 ms):
- every rank sends its (t, loss) batch with a fire-and-forget ``record.remote``;
- every ``refresh_interval`` steps rank 0 pulls the weights and broadcasts them to the other
  ranks with one collective, so every rank switches to the same weights at the same step;
- before a checkpoint every rank waits for its last ``record`` (:meth:`ActorSyncedSampler.
  wait_for_records`, then a collective), so the history rank 0 fetches for the checkpoint holds
  every rank's losses up to that step;
- a worker group that starts without a checkpoint empties the history (rank 0, before the first
  step): a restart before the first checkpoint must not keep the failed attempt's losses; one
  that resumes loads the checkpointed history into the actor;
- if the actor dies, rank 0 notices at its next call, recreates it from the last checkpointed
  history and bumps a generation number that travels with the next weights broadcast; every
  other rank then looks the new actor up by name (``.remote()`` on a dead actor does not raise,
  so they could not notice by themselves). Losses sent to the dead actor are lost.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import numpy as np
import ray
import torch

from raydiff.core.gaussian_diffusion import GaussianDiffusion
from raydiff.core.timestep_sampler import LossSecondMomentResampler, ScheduleSampler

logger = logging.getLogger(__name__)

ACTOR_NAMESPACE = "raydiff"


@ray.remote(num_cpus=0, max_restarts=0)
class LossHistoryActor:
    """Holds a ``LossSecondMomentResampler``'s history; the math stays in raydiff.core."""

    def __init__(self, num_timesteps: int) -> None:
        self._sampler = history_sampler(num_timesteps)
        self._version = 0

    def record(self, ts: np.ndarray, losses: np.ndarray) -> None:
        # Arguments arrive as read-only views of the object store: copy before torch wraps them.
        self._sampler.update_with_all_losses(torch.tensor(ts), torch.tensor(losses))
        self._version += 1

    def reset(self) -> None:
        """Forget every recorded loss (a run starting from scratch)."""
        self._sampler = history_sampler(self._sampler.num_timesteps)
        self._version += 1

    def weights(self) -> tuple[int, np.ndarray]:
        return self._version, self._sampler.weights()

    def state_dict(self) -> dict[str, Any]:
        state = self._sampler.state_dict()
        return {"loss_history": state["loss_history"], "loss_counts": state["loss_counts"]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._sampler = history_sampler(self._sampler.num_timesteps, state)
        self._version += 1


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


def actor_name(run_name: str) -> str:
    return f"loss-history-{run_name}"


def get_or_create_actor(run_name: str, *, num_timesteps: int) -> ray.actor.ActorHandle:
    """The run's named actor, created if it does not exist (one per run)."""
    return LossHistoryActor.options(
        name=actor_name(run_name),
        namespace=ACTOR_NAMESPACE,
        get_if_exists=True,
        lifetime="detached",
    ).remote(num_timesteps)


def kill_actor(run_name: str) -> None:
    """Remove the run's actor (detached actors outlive the driver otherwise)."""
    with contextlib.suppress(ValueError):
        ray.kill(ray.get_actor(actor_name(run_name), namespace=ACTOR_NAMESPACE))


class ActorSyncedSampler(ScheduleSampler):
    """The worker side: samples from weights pulled from the actor, identical on every rank.

    :param broadcast: broadcasts a float64 tensor from rank 0 to all ranks in place
        (``torch.distributed.broadcast``); ``None`` in a single process.
    """

    def __init__(
        self,
        diffusion: GaussianDiffusion,
        *,
        run_name: str,
        rank: int,
        seed: int,
        refresh_interval: int = 10,
        broadcast: Any = None,
    ) -> None:
        super().__init__(diffusion.num_timesteps, seed=seed)
        self.run_name = run_name
        self.rank = rank
        self.refresh_interval = refresh_interval
        self.broadcast = broadcast
        self.actor = get_or_create_actor(run_name, num_timesteps=diffusion.num_timesteps)
        self._weights = np.ones(diffusion.num_timesteps, dtype=np.float64)
        self._steps_seen = 0
        self._last_saved_state: dict[str, Any] | None = None
        self._generation = 0  # actors recreated so far (rank 0 counts, broadcasts to the rest)
        self._pending: Any = None  # this rank's last record call

    def weights(self) -> np.ndarray:
        return self._weights

    def record_losses(self, ts: torch.Tensor, losses: torch.Tensor, *, sync: Any = None) -> None:
        """Send this rank's losses (no wait) and, every refresh_interval steps, switch weights."""
        self._pending = self._call(
            "record", ts.detach().cpu().numpy(), losses.detach().cpu().double().numpy()
        )
        self._steps_seen += 1
        if self._steps_seen % self.refresh_interval == 0:
            self.refresh()

    def refresh(self) -> None:
        """All ranks take rank 0's view of the actor's weights (a collective: call on every rank)."""
        # Slot 0 carries rank 0's actor generation, the rest the weights.
        message = torch.zeros(self.num_timesteps + 1, dtype=torch.float64)
        message[1:] = torch.from_numpy(self._weights)
        if self.rank == 0:
            _, pulled = self._call_get("weights")
            message[0] = self._generation
            message[1:] = torch.tensor(np.asarray(pulled, dtype=np.float64))
        if self.broadcast is not None:
            self.broadcast(message)
        if int(message[0]) != self._generation:  # rank 0 recreated the actor: follow it
            self._generation = int(message[0])
            self.actor = ray.get_actor(actor_name(self.run_name), namespace=ACTOR_NAMESPACE)
            logger.warning("rank %d: switched to the recreated loss-history actor", self.rank)
        self._weights = message[1:].numpy()

    def wait_for_records(self) -> None:
        """Block until the actor has processed this rank's last ``record`` (before a checkpoint).

        A record to a dead actor is dropped here rather than raised: rank 0 recreates the actor
        and the other ranks follow at the next refresh.
        """
        if self._pending is not None:
            with contextlib.suppress(ray.exceptions.RayActorError):
                ray.get(self._pending)
            self._pending = None

    def reset_history(self) -> None:
        """A run starting without a checkpoint: rank 0 empties the actor's history (the actor is
        detached and outlives a failed worker group, so it may hold that attempt's losses)."""
        self._last_saved_state = None
        if self.rank == 0:
            self._call_get("reset")

    def state_dict(self) -> dict[str, Any]:
        """rank 0: the actor's history plus this sampler's RNG and current weights."""
        state = {**super().state_dict(), "weights": torch.from_numpy(self._weights.copy())}
        if self.rank == 0:
            state.update(self._call_get("state_dict"))
            self._last_saved_state = {k: state[k] for k in ("loss_history", "loss_counts")}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from a checkpoint's sampler state (every rank). Checkpoints of a
        single-process run carry the history but no ``weights``; those of a uniform-sampler run
        neither: the weights are then recomputed from the history (uniform without one)."""
        super().load_state_dict(state)
        if "loss_history" in state:
            self._last_saved_state = {k: state[k] for k in ("loss_history", "loss_counts")}
            if self.rank == 0:
                self._call_get("load_state_dict", self._last_saved_state)
        else:
            self.reset_history()
        if "weights" in state:
            self._weights = state["weights"].numpy().astype(np.float64)
        elif "loss_history" in state:  # the same on every rank: computed from the same state
            self._weights = history_sampler(self.num_timesteps, state).weights()
        else:
            self._weights = np.ones(self.num_timesteps, dtype=np.float64)

    # ---------------------------------------------------------------- actor failure handling

    def _call(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self.actor, method).remote(*args)
        except ray.exceptions.RayActorError:
            self._recreate()
            return getattr(self.actor, method).remote(*args)

    def _call_get(self, method: str, *args: Any) -> Any:
        try:
            return ray.get(getattr(self.actor, method).remote(*args))
        except ray.exceptions.RayActorError:
            self._recreate()
            return ray.get(getattr(self.actor, method).remote(*args))

    def _recreate(self) -> None:
        logger.warning(
            "the loss-history actor of run %s died; recreating it from the last checkpoint",
            self.run_name,
        )
        self.actor = get_or_create_actor(self.run_name, num_timesteps=self.num_timesteps)
        if self.rank == 0:
            self._generation += 1
            if self._last_saved_state is not None:
                ray.get(self.actor.load_state_dict.remote(self._last_saved_state))
