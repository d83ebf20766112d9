"""FastDropout: nn.Dropout's semantics with a cheaper CPU mask."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from raydiff.core.dropout import FastDropout, cpu_keep_mask


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_drop_rate_and_scaling(p: float) -> None:
    torch.manual_seed(0)
    x = torch.full((1_000_000,), 2.0)
    out = FastDropout(p).train()(x)
    dropped = (out == 0).double().mean().item()
    # Binomial standard error sqrt(p (1 - p) / n) <= 5e-4: five of them is a generous bound.
    assert abs(dropped - p) < 2.5e-3
    kept = out[out != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 2.0 / (1.0 - p)))
    # Unbiased: the mean survives dropout.
    assert abs(out.mean().item() - 2.0) < 0.02


def test_mask_elements_are_independent_and_cover_every_position() -> None:
    # The 32-bit lanes come from 64-bit draws: neighbouring elements (the two halves of one
    # draw) must not be correlated, and no position may be always kept or always dropped.
    torch.manual_seed(0)
    masks = torch.stack([cpu_keep_mask((4096,), 0.5, dtype=torch.float32) > 0 for _ in range(64)])
    even, odd = masks[:, 0::2].float(), masks[:, 1::2].float()
    both = (even * odd).mean().item()
    assert abs(both - 0.25) < 0.01  # P(keep both) = P(keep) ** 2
    per_position = masks.float().mean(0)
    assert per_position.min() > 0 and per_position.max() < 1


def test_reproducible_under_manual_seed_and_fresh_per_call() -> None:
    layer = FastDropout(0.2).train()
    x = torch.randn(8, 16, 4, 4)
    torch.manual_seed(7)
    first, second = layer(x), layer(x)
    torch.manual_seed(7)
    again = layer(x)
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    assert not torch.equal(first == 0, second == 0)


def test_gradient_uses_the_forward_mask() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 8, 5, 5, requires_grad=True)
    out = FastDropout(0.25).train()(x)
    out.sum().backward()
    expected = torch.where(out != 0, torch.tensor(1 / 0.75), torch.tensor(0.0))
    torch.testing.assert_close(x.grad, expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_keeps_dtype(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x = torch.ones(64, 64, dtype=dtype)
    out = FastDropout(0.5).train()(x)
    assert out.dtype == dtype
    assert set(out.unique().tolist()) == {0.0, 2.0}  # some dropped, the rest scaled by 1/(1-p)


def test_identity_in_eval_mode_and_for_zero_p() -> None:
    x = torch.randn(3, 4)
    assert torch.equal(FastDropout(0.5).eval()(x), x)
    assert torch.equal(FastDropout(0.0).train()(x), x)


def test_is_an_nn_dropout_without_state() -> None:
    layer = FastDropout(0.1)
    assert isinstance(layer, nn.Dropout)
    assert layer.state_dict() == {}


def test_bad_probability_is_named() -> None:
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\), got 1.0"):
        cpu_keep_mask((3,), 1.0, dtype=torch.float32)


def test_traces_without_graph_breaks_under_torch_compile() -> None:
    # The NumPy mask would break the graph; under compilation the layer is plain nn.Dropout.
    layer = torch.compile(FastDropout(0.5).train(), fullgraph=True, backend="eager")
    out = layer(torch.ones(64, 64))
    assert set(out.unique().tolist()) == {0.0, 2.0}
