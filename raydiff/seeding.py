"""Every seed of a run is derived from ``train.seed`` by one function, named by its purpose.

A random stream is keyed by what it is for and where it is used, e.g.
``derive_seed(seed, "noise", step, row)`` for the q_sample noise of one row of a step's global
batch, or ``derive_seed(seed, "order", epoch)`` for one epoch's data order. Because a key is a pure
function of (seed, purpose, position), a run resumed at step k, or on another number of workers,
draws exactly what the uninterrupted run drew there; nothing but the position has to be saved.
Keys are hashed (splitmix64), not added: ``seed + rank + step`` would give rank 0 at step 1000
the stream that rank 1 had at step 999.

Imports nothing: the data plane and the trainer both use it.
"""

from __future__ import annotations

import zlib

_MASK64 = (1 << 64) - 1


def derive_seed(seed: int, *keys: int | str, bits: int = 63) -> int:
    """A seed in ``[0, 2**bits)`` for the stream named by ``keys`` (ints or short strings).

    Stable across processes, machines and Python versions (strings are hashed with CRC-32, not
    ``hash()``). ``bits=32`` gives a seed NumPy and Ray Data accept; torch takes up to 63 bits.
    """
    if not 1 <= bits <= 64:
        raise ValueError(f"bits={bits} is invalid; valid values: 1..64")
    state = _splitmix64(seed & _MASK64)
    for key in keys:
        part = zlib.crc32(key.encode()) | (1 << 32) if isinstance(key, str) else key
        state = _splitmix64((state ^ (part & _MASK64)) & _MASK64)
    return state >> (64 - bits)


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)
