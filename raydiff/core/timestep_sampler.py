"""Timestep samplers: which t each training example gets, and its importance weight.

``UniformSampler`` draws t uniformly. ``LossSecondMomentResampler`` is IDDPM section 3.3's
importance sampler for L_vlb: p_t proportional to sqrt(E[L_t^2]), estimated from the last
``history_per_term`` losses seen at each t.

Unlike the reference, the samplers here
- draw from their own seeded ``torch.Generator`` (never the global NumPy RNG), so a run is
  reproducible and the generator state is checkpointed;
- update the loss history with one vectorised operation per batch (no per-element ``.item()``);
- work with NumPy 2 (the reference used the removed ``np.int``);
- expose ``state_dict()`` / ``load_state_dict()`` so the history survives restarts;
- leave cross-worker synchronisation to a separate, pluggable ``LossSync`` (raydiff's Ray
  training shares the history through an actor instead: ``raydiff.orchestrate``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol

import numpy as np
import torch

from raydiff.core.gaussian_diffusion import GaussianDiffusion

SCHEDULE_SAMPLERS = ("uniform", "loss-second-moment")


class LossSync(Protocol):
    """Gathers every worker's (t, loss) pairs so that all loss-aware samplers see the same data.

    Returns the concatenation over all workers, in the same order on every worker.
    """

    def __call__(
        self, local_ts: torch.Tensor, local_losses: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class ScheduleSampler(ABC):
    """A distribution over timesteps that keeps the training objective unbiased.

    Each sampled t comes with weight ``1 / (T * p_t)``, so that the weighted mean of the losses
    estimates the uniform-t objective.
    """

    def __init__(self, num_timesteps: int, *, seed: int = 0) -> None:
        if num_timesteps < 1:
            raise ValueError(f"num_timesteps must be >= 1, got {num_timesteps}")
        self.num_timesteps = num_timesteps
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(seed)

    @abstractmethod
    def weights(self) -> np.ndarray:
        """Unnormalised float64 weights, one per timestep."""

    def sample(
        self, batch_size: int, device: torch.device | str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw ``batch_size`` timesteps.

        :return: ``(timesteps, weights)``: int64 indices and float32 importance weights
            ``1 / (T * p_t)``, both of shape [batch_size] on ``device``.
        """
        p = torch.from_numpy(self.weights()).to(torch.float64)
        p = p / p.sum()
        indices = torch.multinomial(p, batch_size, replacement=True, generator=self.generator)
        weights = 1.0 / (len(p) * p[indices])
        return indices.to(device), weights.float().to(device)

    def record_losses(  # noqa: B027 -- an optional hook: fixed samplers ignore the losses
        self, ts: torch.Tensor, losses: torch.Tensor, *, sync: LossSync | None = None
    ) -> None:
        """Called by the trainer with every step's (t, loss); a no-op for fixed samplers."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue sampling identically after a restart."""
        return {"rng_state": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.generator.set_state(state["rng_state"])


class UniformSampler(ScheduleSampler):
    """p_t = 1/T; every importance weight is 1."""

    def __init__(self, diffusion: GaussianDiffusion, *, seed: int = 0) -> None:
        super().__init__(diffusion.num_timesteps, seed=seed)
        self._weights = np.ones([diffusion.num_timesteps], dtype=np.float64)

    def weights(self) -> np.ndarray:
        return self._weights


class LossAwareSampler(ScheduleSampler):
    """A sampler whose distribution depends on the losses observed so far."""

    def update_with_local_losses(
        self,
        local_ts: torch.Tensor,
        local_losses: torch.Tensor,
        *,
        sync: LossSync | None = None,
    ) -> None:
        """Record this worker's losses, after gathering every worker's through ``sync``.

        Without ``sync`` (a single process) the local batch is all there is.
        """
        if sync is not None:
            local_ts, local_losses = sync(local_ts, local_losses)
        self.update_with_all_losses(local_ts, local_losses)

    def record_losses(
        self, ts: torch.Tensor, losses: torch.Tensor, *, sync: LossSync | None = None
    ) -> None:
        self.update_with_local_losses(ts, losses, sync=sync)

    @abstractmethod
    def update_with_all_losses(self, ts: torch.Tensor, losses: torch.Tensor) -> None:
        """Record the losses of every worker, in an order that is the same on all of them."""


class LossSecondMomentResampler(LossAwareSampler):
    """IDDPM section 3.3: p_t proportional to sqrt(E[L_t^2]), mixed with uniform_prob of uniform.

    The distribution is uniform until every t has ``history_per_term`` losses recorded. Each t keeps
    a FIFO of its last ``history_per_term`` losses.
    """

    def __init__(
        self,
        diffusion: GaussianDiffusion,
        history_per_term: int = 10,
        uniform_prob: float = 0.001,
        *,
        seed: int = 0,
    ) -> None:
        super().__init__(diffusion.num_timesteps, seed=seed)
        if history_per_term < 1:
            raise ValueError(f"history_per_term must be >= 1, got {history_per_term}")
        if not 0.0 <= uniform_prob <= 1.0:
            raise ValueError(f"uniform_prob must lie in [0, 1], got {uniform_prob}")
        self.history_per_term = history_per_term
        self.uniform_prob = uniform_prob
        self._loss_history = torch.zeros(
            diffusion.num_timesteps, history_per_term, dtype=torch.float64
        )
        self._loss_counts = torch.zeros(diffusion.num_timesteps, dtype=torch.int64)

    def weights(self) -> np.ndarray:
        if not self._warmed_up():
            return np.ones([self.num_timesteps], dtype=np.float64)
        # p_t = (1 - u) sqrt(mean(L_t^2)) / sum + u / T (IDDPM section 3.3), float64 [T].
        weights = torch.sqrt(torch.mean(self._loss_history**2, dim=-1))
        weights = weights / weights.sum() * (1 - self.uniform_prob)
        return (weights + self.uniform_prob / len(weights)).numpy()

    def _warmed_up(self) -> bool:
        return bool((self._loss_counts == self.history_per_term).all())

    def update_with_all_losses(self, ts: torch.Tensor, losses: torch.Tensor) -> None:
        # Also accepts Python lists (the reference's ``ts.tolist(), losses.tolist()``): a list of
        # floats must become float64 directly, not via torch's default float32.
        self._loss_history, self._loss_counts = append_loss_history(
            self._loss_history,
            self._loss_counts,
            ts=torch.as_tensor(ts).detach().cpu(),
            losses=torch.as_tensor(losses, dtype=torch.float64).detach().cpu(),
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "loss_history": self._loss_history.clone(),
            "loss_counts": self._loss_counts.clone(),
            "history_per_term": self.history_per_term,
            "uniform_prob": self.uniform_prob,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        history = torch.as_tensor(state["loss_history"], dtype=torch.float64)
        expected = (self.num_timesteps, self.history_per_term)
        if tuple(history.shape) != expected:
            raise ValueError(
                f"sampler state has loss history of shape {tuple(history.shape)}, but this "
                f"sampler needs {expected} (num_timesteps, history_per_term): was it saved with a "
                "different diffusion_steps?"
            )
        super().load_state_dict(state)
        self._loss_history = history.clone()
        self._loss_counts = torch.as_tensor(state["loss_counts"], dtype=torch.int64).clone()


def append_loss_history(
    history: torch.Tensor,
    counts: torch.Tensor,
    *,
    ts: torch.Tensor,
    losses: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Push ``losses`` into per-timestep FIFOs of length H, in batch order, all at once.

    A pure function of its inputs (new tensors are returned). Equivalent to appending each
    (t, loss) in turn: a row that is not yet full fills from the left; a full row drops its oldest
    entries. ``history`` is [T, H] float64, ``counts`` [T] int64 (entries filled per row).
    """
    num_timesteps, hist_len = history.shape
    ts = torch.as_tensor(ts).reshape(-1).long()
    losses = torch.as_tensor(losses, dtype=torch.float64).reshape(-1)  # lists: never via float32
    if ts.numel() != losses.numel():
        raise ValueError(f"got {ts.numel()} timesteps but {losses.numel()} losses")
    if ts.numel() == 0:
        return history.clone(), counts.clone()
    if int(ts.min()) < 0 or int(ts.max()) >= num_timesteps:
        raise ValueError(f"timesteps must lie in [0, {num_timesteps}), got {ts.min()}..{ts.max()}")

    # Group the batch by t, keeping batch order inside a group (stable sort).
    order = torch.sort(ts, stable=True).indices
    ts_sorted, losses_sorted = ts[order], losses[order]
    rows, group_sizes = torch.unique_consecutive(ts_sorted, return_counts=True)  # [U], [U]
    group_starts = torch.cumsum(group_sizes, 0) - group_sizes  # [U]

    old_counts = counts[rows]  # [U]
    total = old_counts + group_sizes  # entries each row would hold without the FIFO limit
    shift = (total - hist_len).clamp(min=0)  # how many of the oldest entries fall out
    new_counts = total.clamp(max=hist_len)

    # Slot k of a new row holds element (k + shift) of old_entries ++ new_entries.
    slots = torch.arange(hist_len).unsqueeze(0)  # [1, H]
    src = slots + shift.unsqueeze(1)  # [U, H]
    from_old = src < old_counts.unsqueeze(1)
    old_values = history[rows].gather(1, src.clamp(max=hist_len - 1))
    new_index = (group_starts.unsqueeze(1) + src - old_counts.unsqueeze(1)).clamp(0, ts.numel() - 1)
    new_values = losses_sorted[new_index]
    filled = slots < new_counts.unsqueeze(1)
    row_values = torch.where(from_old, old_values, new_values)
    row_values = torch.where(filled, row_values, history[rows])

    new_history = history.clone()
    new_history[rows] = row_values
    new_counts_all = counts.clone()
    new_counts_all[rows] = new_counts
    return new_history, new_counts_all


def create_named_schedule_sampler(
    name: str, diffusion: GaussianDiffusion, *, seed: int = 0
) -> ScheduleSampler:
    """Build a sampler from its improved-diffusion flag name (``--schedule_sampler``)."""
    if name == "uniform":
        return UniformSampler(diffusion, seed=seed)
    if name == "loss-second-moment":
        return LossSecondMomentResampler(diffusion, seed=seed)
    raise ValueError(f"unknown schedule_sampler {name!r}; valid: {', '.join(SCHEDULE_SAMPLERS)}")
