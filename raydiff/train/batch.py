"""What the loop hands a task: a training batch and the validation batches."""

from __future__ import annotations

from typing import Any

import torch

Batch = dict[str, Any]
"""``x`` float32 [B, C, H, W] in [-1, 1], ``index`` int64 [B], ``y`` int64 [B] when labelled;
in a task's ``losses``, also ``noise`` (like ``x``): the step's standard normal draw for these
rows, the noise of ``q_sample``, and ``augment_seed`` (int64 [B], on the CPU): a seed per row
for a task's random augmentations, keyed by the row's place in the global batch, so that they do
not depend on the number of workers or microbatches."""

ValBatches = list[tuple[torch.Tensor, dict[str, torch.Tensor]]]
"""Validation images on the device, with their labels (``y``) when the runtime was asked for
them."""
