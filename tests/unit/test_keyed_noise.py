"""raydiff.core.keyed_noise: SplitMix64 streams keyed per row, drawn for a whole batch at once."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raydiff.core.keyed_noise import RowNoise, keyed_normal, row_keys, splitmix64
from raydiff.seeding import _splitmix64, derive_seed

pytestmark = pytest.mark.unit

MASK = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def as_unsigned(t: torch.Tensor) -> list[int]:
    return [int(v) & MASK for v in t]


def test_splitmix64_on_tensors_is_seedings_bit_for_bit_through_int64_wrap_around():
    values = [0, 1, 2**62 + 12345, 2**63 - 1, 2**64 - 1, 0xDEADBEEFCAFEF00D]
    signed = torch.tensor([v - (1 << 64) if v >= 1 << 63 else v for v in values])
    assert as_unsigned(splitmix64(signed)) == [_splitmix64(v) for v in values]


def test_row_keys_continue_derive_seeds_chain():
    rows = [0, 1, 7, 127, 10**6]
    keys = row_keys(derive_seed(5, "noise", 42, bits=64), rows, device="cpu")
    assert as_unsigned(keys) == [derive_seed(5, "noise", 42, r, bits=64) for r in rows]
    with pytest.raises(ValueError, match=r"prefix=-1 is invalid"):
        row_keys(-1, rows, device="cpu")


def test_a_streams_values_are_splitmix64_outputs_through_box_muller():
    """Normals 2j and 2j+1 of the stream keyed k come from output j = mix(k + (j+1) GAMMA),
    its top 24 bits the radius and the next 24 the angle (computed here in float64)."""
    key = derive_seed(1, "sample", 3, bits=64)
    got = keyed_normal(torch.tensor([key - (1 << 64) if key >= 1 << 63 else key]), numel=6)[0]
    expected = []
    for j in range(3):
        z = _splitmix64((key + j * GAMMA) & MASK)
        u1 = ((z >> 40) + 0.5) * 2.0**-24
        u2 = ((z >> 16) & 0xFFFFFF) * 2.0**-24
        radius = math.sqrt(-2 * math.log(u1))
        expected += [radius * math.cos(2 * math.pi * u2), radius * math.sin(2 * math.pi * u2)]
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_a_rows_draws_do_not_depend_on_the_batch_it_is_in():
    prefix = derive_seed(9, "sample", bits=64)
    whole = RowNoise.for_rows(prefix, range(6), device="cpu")
    part = RowNoise.for_rows(prefix, [4, 2], device="cpu")
    for _ in range(3):  # successive draws of odd sizes keep every stream in step
        a, b = whole.draw((6, 3, 5)), part.draw((2, 3, 5))
        torch.testing.assert_close(b, a[[4, 2]], rtol=0, atol=0)
        assert not torch.equal(a[0], a[1])


def test_successive_draws_continue_the_stream():
    keys = row_keys(derive_seed(2, "x", bits=64), range(3), device="cpu")
    noise = RowNoise(keys)
    first, second = noise.draw((3, 4)), noise.draw((3, 4))
    torch.testing.assert_close(torch.cat([first, second], dim=1), keyed_normal(keys, numel=8))


def test_the_normals_are_standard_and_uncorrelated():
    """Moments of 2M draws across 64 rows, Kolmogorov-Smirnov against N(0, 1), and the
    correlation of neighbouring rows, of neighbouring positions and of a row's cos/sin pair."""
    from scipy import stats

    keys = row_keys(derive_seed(0, "noise", 17, bits=64), range(64), device="cpu")
    x = keyed_normal(keys, numel=32768).double()
    flat = x.flatten().numpy()
    assert abs(flat.mean()) < 3 * (1 / math.sqrt(flat.size)) * 1.5
    assert abs(flat.std() - 1) < 2e-3
    assert abs(stats.kurtosis(flat)) < 0.02 and abs(stats.skew(flat)) < 0.01
    assert stats.kstest(flat[:200_000], "norm").pvalue > 1e-3
    for a, b in ((x[:-1], x[1:]), (x[:, :-1], x[:, 1:]), (x[:, 0::2], x[:, 1::2])):
        r = np.corrcoef(a.flatten().numpy(), b.flatten().numpy())[0, 1]
        assert abs(r) < 5 / math.sqrt(a.numel()), r


def test_a_draw_of_the_wrong_rows_or_keys_is_refused():
    with pytest.raises(ValueError, match="a draw of 3 rows from noise of 2 rows"):
        RowNoise(torch.zeros(2, dtype=torch.int64)).draw((3, 4))
    with pytest.raises(ValueError, match="keys must be int64"):
        RowNoise(torch.zeros(2))
    with pytest.raises(ValueError, match="start=1 is invalid"):
        keyed_normal(torch.zeros(2, dtype=torch.int64), numel=4, start=1)


def test_the_dtype_is_the_one_asked_for():
    noise = RowNoise.for_rows(derive_seed(0, bits=64), range(2), device="cpu")
    assert noise.draw((2, 3), torch.float64).dtype == torch.float64
