"""Where a run is in its data: the epoch and how many of its batches were trained on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class DataPosition:
    """The epoch and the number of its batches a run has trained on.

    Saved in every checkpoint as ``epoch`` and ``epoch_samples`` (global samples, so a run resumed
    on another number of workers skips the same amount of the epoch).
    """

    epoch: int = 0
    batches: int = 0

    @classmethod
    def from_state(cls, state: dict[str, Any], *, global_batch: int) -> DataPosition:
        """From a checkpoint's trainer state (or its progress.json); zeros when absent."""
        return cls(
            epoch=int(state.get("epoch", 0)),
            batches=int(state.get("epoch_samples", 0)) // global_batch,
        )

    def advance(self, epoch: int) -> None:
        """Count one batch of ``epoch`` (a new epoch starts the count again)."""
        if epoch != self.epoch:
            self.epoch, self.batches = epoch, 0
        self.batches += 1

    def state(self, *, global_batch: int) -> dict[str, int]:
        """The checkpoint entries: ``epoch`` and ``epoch_samples``."""
        return {"epoch": self.epoch, "epoch_samples": self.batches * global_batch}
