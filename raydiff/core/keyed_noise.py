"""Standard normal noise for many rows at once, each row from its own keyed stream.

raydiff keys every row's noise by what the row is (a training row by (seed, step, row of the
global batch), a sample by (seed, sample index)), so a row draws the same noise on one worker or
many, in any batch. One ``torch.Generator`` per row gives that, but costs a generator seeding and
a small ``randn`` launch per row: on a GPU, a few milliseconds per step at a batch of 128. Here
every row's stream is SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number
generators", OOPSLA 2014) indexed directly: output ``i`` of the stream seeded ``key`` is
``mix(key + (i + 1) * GAMMA)``, a pure function of (key, i), so a whole batch's draw is a dozen
elementwise integer operations on the device, whatever the batch. Pairs of outputs become normals
by the Box-Muller transform.

The integer part is exact on every device (int64 arithmetic wraps modulo 2**64 on CPUs and GPUs);
the normals agree across devices to the rounding of ``log``/``cos``/``sin``. The stream of a key
is the one :func:`raydiff.seeding.derive_seed`'s SplitMix64 defines, and :func:`row_keys` takes
its chain one step further for every row at once. Pure torch, like the rest of ``raydiff.core``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

_GAMMA = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def _int64(value: int) -> int:
    """An unsigned 64-bit constant as the int64 with the same bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` on int64 is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def splitmix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's step on int64 tensors: add GAMMA, then the finaliser (bit for bit
    :func:`raydiff.seeding._splitmix64`, as int64)."""
    z = z + _int64(_GAMMA)
    z = (z ^ _shift_right(z, 30)) * _int64(_MIX1)
    z = (z ^ _shift_right(z, 27)) * _int64(_MIX2)
    return z ^ _shift_right(z, 31)


def row_keys(
    prefix: int, rows: torch.Tensor | Sequence[int], *, device: torch.device | str
) -> torch.Tensor:
    """int64 ``[N]``, one stream key per row: SplitMix64 of ``prefix ^ row``, the step that
    :func:`raydiff.seeding.derive_seed` chains, so with ``prefix = derive_seed(seed, *keys,
    bits=64)`` a row's key is ``derive_seed(seed, *keys, row, bits=64)`` (as int64)."""
    if not 0 <= prefix < 1 << 64:
        raise ValueError(f"prefix={prefix} is invalid: a 64-bit key in [0, 2**64)")
    rows = torch.as_tensor(rows, dtype=torch.int64, device=device)
    return splitmix64(rows ^ _int64(prefix))


def keyed_normal(
    keys: torch.Tensor, *, numel: int, start: int = 0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``[len(keys), numel]`` standard normals: row ``r`` holds normals ``start .. start+numel-1``
    of the stream keyed ``keys[r]``, on ``keys``' device. Normals ``2j`` and ``2j+1`` of a stream
    come from its output ``j`` (Box-Muller), so ``start`` must be even: a draw takes whole pairs."""
    if start % 2:
        raise ValueError(f"start={start} is invalid: draws begin at an even position")
    pairs = (numel + 1) // 2
    counters = torch.arange(start // 2, start // 2 + pairs, device=keys.device)
    z = splitmix64(keys.to(torch.int64)[:, None] + counters[None, :] * _int64(_GAMMA))
    # Two 24-bit uniforms from one output: u1 in (0, 1) (never 0, for the log), u2 in [0, 1).
    # float32 holds 24 bits exactly; the deepest tail is sqrt(-2 ln 2^-25) = 5.9 sigma.
    u1 = (_shift_right(z, 40).to(torch.float32) + 0.5) * 2.0**-24
    u2 = ((z >> 16) & 0xFFFFFF).to(torch.float32) * 2.0**-24
    # Box-Muller: r cos(theta) and r sin(theta), interleaved, as one complex number each.
    radius = torch.sqrt(-2.0 * torch.log(u1))
    normals = torch.view_as_real(torch.polar(radius, (2.0 * math.pi) * u2))
    return normals.reshape(len(keys), 2 * pairs)[:, :numel].to(dtype)


class RowNoise:
    """A noise source for a batch whose rows each have a stream (``keys``, int64 ``[B]``): each
    :meth:`draw` takes the next values of every row's stream, so row ``r``'s ``d``-th draw is the
    same in any batch that holds it. The sampling loops take it as their ``generator``."""

    def __init__(self, keys: torch.Tensor) -> None:
        if keys.dtype != torch.int64 or keys.dim() != 1:
            raise ValueError(f"keys must be int64 [B], got {keys.dtype} {tuple(keys.shape)}")
        self.keys = keys
        self.position = 0

    @classmethod
    def for_rows(
        cls, prefix: int, rows: torch.Tensor | Sequence[int], *, device: torch.device | str
    ) -> RowNoise:
        """The streams of ``rows`` under ``prefix`` (see :func:`row_keys`)."""
        return cls(row_keys(prefix, rows, device=device))

    def __len__(self) -> int:
        return len(self.keys)

    def draw(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``shape`` (``shape[0]`` rows, one per key) of standard normals, on the keys' device."""
        if shape[0] != len(self.keys):
            raise ValueError(
                f"a draw of {shape[0]} rows from noise of {len(self.keys)} rows: one key per row"
            )
        numel = math.prod(shape[1:])
        noise = keyed_normal(self.keys, numel=numel, start=self.position, dtype=dtype)
        self.position += numel + numel % 2  # whole pairs: the next draw starts even
        return noise.reshape(shape)
