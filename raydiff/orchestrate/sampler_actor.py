"""The loss-aware timestep sampler's history in one Ray actor shared by all training workers.

Why an actor: the history must outlive a worker restart and be identical for every rank. The
reference all-gathers (t, loss) every step with one ``.item()`` per element and loses the history
on every restart.

Protocol (off the step's critical path, see ray-notes.md: an actor round trip is ~2 ms):
- every rank sends its (t, loss) batch with a fire-and-forget ``record.remote``;
- every ``refresh_interval`` steps rank 0 pulls the weights and broadcasts them to the other
  ranks with one collective, so every rank switches to the same weights at the same step;
- rank 0 fetches the actor's state for every checkpoint; on resume it loads the checkpointed
  state into the actor; if the actor dies it is recreated from the last checkpointed state.
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

    def __init__(self, num_timesteps: int, history_per_term: int, uniform_prob: float) -> None:
        self._sampler = LossSecondMomentResampler(
            _StepCount(num_timesteps), history_per_term, uniform_prob
        )
        self._version = 0

    def record(self, ts: np.ndarray, losses: np.ndarray) -> None:
        self._sampler.update_with_all_losses(torch.from_numpy(ts), torch.from_numpy(losses))
        self._version += 1

    def weights(self) -> tuple[int, np.ndarray]:
        return self._version, self._sampler.weights()

    def state_dict(self) -> dict[str, Any]:
        state = self._sampler.state_dict()
        return {"loss_history": state["loss_history"], "loss_counts": state["loss_counts"]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        full = self._sampler.state_dict()
        full.update(loss_history=state["loss_history"], loss_counts=state["loss_counts"])
        self._sampler.load_state_dict(full)
        self._version += 1


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
    ).remote(num_timesteps, 10, 0.001)


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

    def weights(self) -> np.ndarray:
        return self._weights

    def record_losses(self, ts: torch.Tensor, losses: torch.Tensor, *, sync: Any = None) -> None:
        """Send this rank's losses (no wait) and, every refresh_interval steps, switch weights."""
        self._call("record", ts.detach().cpu().numpy(), losses.detach().cpu().double().numpy())
        self._steps_seen += 1
        if self._steps_seen % self.refresh_interval == 0:
            self.refresh()

    def refresh(self) -> None:
        """All ranks take rank 0's view of the actor's weights (a collective: call on every rank)."""
        weights = torch.from_numpy(self._weights.copy())
        if self.rank == 0:
            _, pulled = self._call_get("weights")
            weights = torch.from_numpy(np.asarray(pulled, dtype=np.float64))
        if self.broadcast is not None:
            self.broadcast(weights)
        self._weights = weights.numpy()

    def state_dict(self) -> dict[str, Any]:
        """rank 0: the actor's history plus this sampler's RNG and current weights."""
        state = {**super().state_dict(), "weights": torch.from_numpy(self._weights.copy())}
        if self.rank == 0:
            state.update(self._call_get("state_dict"))
            self._last_saved_state = {k: state[k] for k in ("loss_history", "loss_counts")}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._weights = state["weights"].numpy().astype(np.float64)
        if "loss_history" in state:
            self._last_saved_state = {k: state[k] for k in ("loss_history", "loss_counts")}
            if self.rank == 0:
                self._call_get("load_state_dict", self._last_saved_state)

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
        if self._last_saved_state is not None and self.rank == 0:
            ray.get(self.actor.load_state_dict.remote(self._last_saved_state))
