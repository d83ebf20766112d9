"""Images/s, step time and data-wait share over the steps between two reports."""

from __future__ import annotations

import time


class ThroughputWindow:
    """Images/s, step time and data-wait share over the steps since the last ``read``.

    Only time inside steps counts (waiting for the batch + the optimiser step), so evaluation,
    sample grids, checkpoints and report barriers between steps do not dilute the figures.
    """

    def __init__(self, images_per_step: int) -> None:
        self.images_per_step = images_per_step
        self._reset()

    def _reset(self) -> None:
        self.steps, self.busy, self.data_wait = 0, 0.0, 0.0

    def begin(self) -> None:
        """Call before fetching the step's batch."""
        self._t0 = time.perf_counter()

    def data_ready(self) -> None:
        """Call once the batch is there."""
        self._t1 = time.perf_counter()

    def end(self) -> None:
        """Call after the optimiser step."""
        t2 = time.perf_counter()
        self.steps += 1
        self.busy += t2 - self._t0
        self.data_wait += self._t1 - self._t0

    def read(self) -> dict[str, float]:
        """The window's figures; starts a new window."""
        busy = max(self.busy, 1e-9)
        out = {
            "images_per_s": self.steps * self.images_per_step / busy,
            "step_time": busy / max(self.steps, 1),
            "data_wait_fraction": self.data_wait / busy,
        }
        self._reset()
        return out
