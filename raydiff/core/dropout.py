"""Dropout whose CPU mask costs a fifth of ``torch.bernoulli_``.

On CPU, ``nn.Dropout`` draws its mask with ``bernoulli_``, about 6.5 ns per element on this
machine's cores: 5% of a UNet training step in fp32 and 7% in bf16 (``bench/core_step.py
--profile``). :class:`FastDropout` draws 32 random bits per element with NumPy's PCG64 bit
generator (~1.2 ns per element) and keeps an element when its bits are at or above
``round(p * 2**32)``, so the drop probability equals ``p`` to within ``2**-33``. Kept elements are
scaled by ``1 / (1 - p)`` as in ``nn.Dropout``.

The PCG64 stream is seeded with one draw from torch's default CPU generator, so masks are
reproducible under ``torch.manual_seed`` and replayed exactly when ``torch.utils.checkpoint``
recomputes a block (it restores the torch RNG state before the recomputation). On other devices,
in eval mode, for ``p == 0``, with ``inplace=True`` and under ``torch.compile`` it is plain
``nn.Dropout``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

_BITS = 32


def cpu_keep_mask(
    shape: torch.Size | tuple[int, ...], p: float, *, dtype: torch.dtype
) -> torch.Tensor:
    """A CPU tensor of ``shape`` holding ``1 / (1 - p)`` where kept and ``0`` where dropped.

    Each element is dropped independently with probability ``p`` (quantised to ``2**-32``).
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p!r}")
    numel = int(np.prod(shape, dtype=np.int64))
    # One draw from torch's generator seeds the stream: reproducible under torch.manual_seed.
    seed = int(torch.randint(0, 2**63 - 1, (1,), dtype=torch.int64))
    generator = np.random.PCG64(seed)
    bits = generator.random_raw((numel + 1) // 2).view(np.uint32)[:numel]  # 2 draws per uint64
    threshold = np.uint32(min(round(p * 2**_BITS), 2**_BITS - 1))
    keep = torch.from_numpy(bits >= threshold).view(shape)  # bool, P(True) = 1 - p
    # Same dtype as the activations: a bool x float multiply takes a slow promotion path.
    return keep.to(dtype).mul_(1.0 / (1.0 - p))


class _MaskedScale(torch.autograd.Function):
    """``x * mask`` with the mask saved for the backward pass (it is not differentiated)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (mask,) = ctx.saved_tensors
        return grad * mask, None


class FastDropout(nn.Dropout):
    """``nn.Dropout`` with a faster mask on CPU (see the module docstring); no parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            not self.training
            or self.p == 0.0
            or self.inplace
            or x.device.type != "cpu"
            or torch.compiler.is_compiling()  # NumPy would break the graph; inductor has its RNG
        ):
            return super().forward(x)
        return _MaskedScale.apply(x, cpu_keep_mask(x.shape, self.p, dtype=x.dtype))
