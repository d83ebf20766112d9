"""Generate samples whose pixels depend only on (seed, sample index). No Ray here.

Sample ``i`` draws its starting noise and every step's noise from its own stream, keyed
``derive_seed(seed, "sample", i)`` (:mod:`raydiff.core.keyed_noise`: the whole batch's noise in
one draw on the model's device), and its class label (for class-conditional models) from
``derive_seed(seed, "label", i)``. The work is cut into fixed batches of indices
(:func:`index_batches`): batch ``k`` holds samples ``[k * batch_size, (k + 1) * batch_size)``
whoever computes it, so the same seed gives the same images on one worker or many (the same
tensor shapes on the same hardware give the same floating-point results), in each precision
(:func:`sampling_precision`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, get_args

import numpy as np
import torch

from raydiff.config import Precision
from raydiff.core.gaussian_diffusion import GaussianDiffusion
from raydiff.core.keyed_noise import RowNoise
from raydiff.seeding import derive_seed
from raydiff.train.precision import autocast_model


def index_batches(num_samples: int, batch_size: int) -> list[range]:
    """The fixed batches of sample indices: ``[0, B), [B, 2B), ...`` (the last may be short)."""
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples} is invalid: must be >= 1")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} is invalid: must be >= 1")
    return [range(s, min(s + batch_size, num_samples)) for s in range(0, num_samples, batch_size)]


CPU_AUTO_BATCH = 16
"""``--batch-size 0`` on a CPU: the default batch (a CPU's memory is not what bounds it)."""
MAX_AUTO_BATCH = 1024


def auto_batch_limit(*, num_samples: int, num_workers: int) -> int:
    """The largest batch ``--batch-size 0`` tries: the power of two that holds a worker's share
    of the samples, at most :data:`MAX_AUTO_BATCH` (a larger batch would only leave a worker
    idle)."""
    share = -(-num_samples // num_workers)
    return min(MAX_AUTO_BATCH, 1 << max(share - 1, 0).bit_length())


def largest_fitting_batch(fits: Callable[[int], bool], *, limit: int) -> int:
    """The largest of ``limit, limit/2, ..., 1`` for which ``fits(batch)`` (one sampling step at
    that batch ran in the device's memory); a ``ValueError`` if not even one sample fits."""
    batch = limit
    while batch >= 1:
        if fits(batch):
            return batch
        batch //= 2
    raise ValueError("not even one sample's sampling step fits in the GPU's free memory")


def sample_labels(
    seed: int, indices: Sequence[int], *, num_classes: int, class_labels: Sequence[int] = ()
) -> np.ndarray:
    """Class labels of the samples at ``indices``: ``class_labels`` in turn when given (sample i
    gets ``class_labels[i % len]``), else drawn uniformly from (seed, i)."""
    if class_labels:
        bad = [c for c in class_labels if not 0 <= c < num_classes]
        if bad:
            raise ValueError(
                f"class labels {bad} are invalid: the model has classes 0..{num_classes - 1}"
            )
        return np.array([class_labels[i % len(class_labels)] for i in indices], dtype=np.int64)
    return np.array(
        [derive_seed(seed, "label", int(i)) % num_classes for i in indices], dtype=np.int64
    )


def sampling_precision(precision: str, *, device: torch.device) -> str:
    """The precision of the model's forward in the sampling loop on ``device``: ``auto`` is fp32
    on a CPU, and on CUDA bf16 where the GPU has it, else fp16 (a choice still to be confirmed
    by a GPU benchmark: docs/testing.md). fp16 on a CPU is refused: CPUs have no fast fp16
    kernels (docs/performance.md)."""
    if precision not in get_args(Precision):
        raise ValueError(
            f"precision {precision!r} is invalid; valid: {', '.join(get_args(Precision))}"
        )
    if precision == "auto":
        if device.type != "cuda":
            return "fp32"
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if precision == "fp16" and device.type == "cpu":
        raise ValueError(
            "precision 'fp16' is invalid on a CPU (CPUs have no fast fp16 kernels: the demo "
            "model's forward ran 34x slower than in fp32); valid there: auto, fp32, bf16"
        )
    return precision


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    diffusion: GaussianDiffusion,
    *,
    indices: Sequence[int],
    image_shape: tuple[int, int, int],
    seed: int,
    use_ddim: bool = False,
    eta: float = 0.0,
    clip_denoised: bool = True,
    labels: np.ndarray | None = None,
    cond_fn: Any = None,
    low_res: torch.Tensor | None = None,
    precision: str = "fp32",
) -> np.ndarray:
    """Samples ``indices`` as uint8 ``[N, H, W, C]`` (improved-diffusion's ``arr_0`` layout).

    ``diffusion`` decides the steps (a respaced one samples on its own timesteps); ``use_ddim``
    runs the DDIM loop with ``eta`` (0: deterministic given the starting noise), else ancestral
    sampling. ``labels`` (``[N]``): the classes of a class-conditional model, and the classes
    ``cond_fn`` (classifier guidance) steers towards; an unconditional model guided by a
    classifier does not see them. ``low_res`` (``[N, C, h, w]`` in [-1, 1]): an upsampler's
    input, one per sample. ``precision`` (:func:`sampling_precision`): the model's forward
    autocasts to it; the diffusion's arithmetic and ``cond_fn`` (the classifier's gradient) stay
    fp32.
    """
    device = next(model.parameters()).device
    shape = (len(indices), *image_shape)
    kwargs: dict[str, Any] = {}
    if labels is not None:
        kwargs["y"] = torch.as_tensor(labels, device=device)
    if low_res is not None:
        kwargs["low_res"] = low_res.to(device)
    net = autocast_model(model, sampling_precision(precision, device=device), device=device)
    denoiser: Any = net
    if labels is not None and getattr(model, "num_classes", None) is None:
        # guided-diffusion's classifier_sample.py: y goes to cond_fn, not to an unconditional
        # model; the model's other inputs (an upsampler's low_res) still reach it.
        def denoiser(
            x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None, **other: Any
        ) -> Any:
            return net(x, t, **other)

    loop = diffusion.ddim_sample_loop if use_ddim else diffusion.p_sample_loop
    extra = {"eta": eta} if use_ddim else {}
    images = loop(
        denoiser,
        shape,
        clip_denoised=clip_denoised,
        cond_fn=cond_fn,
        model_kwargs=kwargs,
        device=device,
        # A noise stream per sample, keyed from (seed, index) alone.
        generator=RowNoise.for_rows(
            derive_seed(seed, "sample", bits=64), list(indices), device=device
        ),
        **extra,
    )
    return to_uint8(images)


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """``[N, C, H, W]`` in [-1, 1] -> ``[N, H, W, C]`` uint8 exactly as improved-diffusion's
    ``image_sample.py`` converts (``((x + 1) * 127.5).clamp(0, 255).to(uint8)``: truncation, so
    FID statistics of raydiff's npz files compare with theirs)."""
    pixels = ((images.detach().float().cpu() + 1) * 127.5).clamp(0, 255).to(torch.uint8)
    return pixels.permute(0, 2, 3, 1).contiguous().numpy()
