"""Mixed precision: autocast for the forward pass and dynamic loss scaling for fp16.

fp32 runs as is; bf16 autocasts (its range matches fp32, so no loss scaling); fp16 autocasts and
uses ``torch.amp.GradScaler``, which works on CPU as well as CUDA. Model weights, optimiser state
and EMA weights stay in fp32 in every mode. Sampling (``raydiff sample --precision``, a compiled
run's previews) autocasts the model's forward only (:func:`autocast_model`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(precision: str, device: torch.device) -> str:
    """``auto`` -> the fastest safe mode of ``device``; any other mode as it is.

    bf16 where the device has native bf16 kernels (CUDA with bf16 support; a CPU whose oneDNN
    has bf16, i.e. AVX512-BF16 or AMX), else fp16 with loss scaling on a GPU and fp32 on a CPU.
    """
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if native_cpu_bf16() else "fp32"


def native_cpu_bf16() -> bool:
    """Whether this CPU runs bf16 convolutions natively (without it oneDNN emulates them: a
    training step measured 16x slower than fp32 on an AVX2-only CPU)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch build without oneDNN
        return False


class AutocastModel(torch.nn.Module):
    """``model`` whose forward runs under ``torch.autocast`` to ``dtype`` on ``device_type`` and
    returns fp32: a sampling loop's means, variances and x_t updates then stay in fp32, as the
    originals' do (improved-diffusion's ``--use_fp16`` model also returns ``x``'s dtype)."""

    def __init__(self, model: torch.nn.Module, *, dtype: torch.dtype, device_type: str) -> None:
        super().__init__()
        self.model = model
        self.dtype = dtype
        self.device_type = device_type

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        with torch.autocast(device_type=self.device_type, dtype=self.dtype):
            output = self.model(*args, **kwargs)
        return output.float()


def autocast_model(
    model: torch.nn.Module, precision: str, *, device: torch.device
) -> torch.nn.Module:
    """``model`` for a sampling loop in ``precision`` (fp32, bf16 or fp16, resolved): itself for
    fp32, else an :class:`AutocastModel` on ``device``'s type."""
    dtype = _dtype(precision)
    if dtype is None:
        return model
    return AutocastModel(model, dtype=dtype, device_type=device.type)


def _dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a resolved ``precision`` (None: fp32)."""
    if precision not in _DTYPES:
        raise ValueError(f"precision {precision!r} is invalid; valid: {', '.join(_DTYPES)}")
    return _DTYPES[precision]


class PrecisionPolicy:
    """Autocast context and gradient scaling for one precision mode on one device."""

    def __init__(
        self, precision: str, *, device: torch.device, init_scale: float = 2.0**16
    ) -> None:
        self.precision = precision = resolve_precision(precision, device)
        self.device = device
        self.dtype = _dtype(precision)
        self.scaler = (
            torch.amp.GradScaler(device.type, init_scale=init_scale)
            if precision == "fp16"
            else None
        )
        if precision == "bf16" and device.type == "cpu" and not native_cpu_bf16():
            logger.warning(
                "precision bf16 on a CPU without native bf16 kernels (no AVX512-BF16/AMX): "
                "oneDNN emulates them and a step runs 10-40x slower than fp32; use "
                "train.precision=auto or fp32"
            )
        if precision == "fp16" and device.type == "cpu":
            # It works (and CI tests the loss scaling on CPU), but it is rarely what anyone wants.
            logger.warning(
                "precision fp16 on CPU: most CPUs have no fast fp16 convolutions (a training step "
                "ran ~20x slower than fp32 in bench/core_step.py); use bf16 on CPU (where it is native, "
                "precision=auto picks it), fp16 on GPUs"
            )

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context for the forward pass and the loss."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call ``backward`` on."""
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients back to their true scale (before clipping or measuring them)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, *, grads_finite: bool) -> bool:
        """Step the optimiser if the gradients are finite; returns whether it stepped.

        With fp16 the scaler also halves its scale on a skipped step and grows it after
        ``growth_interval`` good ones.
        """
        if self.scaler is not None:
            self.scaler.step(optimizer)  # skips internally when it found inf/nan
            self.scaler.update()
            return grads_finite
        if grads_finite:
            optimizer.step()
        return grads_finite

    @property
    def loss_scale(self) -> float:
        """The current loss scale (1.0 without scaling)."""
        return float(self.scaler.get_scale()) if self.scaler is not None else 1.0

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
