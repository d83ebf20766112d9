"""Tiny models of the tests: the UNet of the tests that train or evaluate one (as ``--set``
overrides), and a stand-in for FID's Inception network.

The UNet: 16x16x1 (or 8x8x1), 32 channels, two levels of one residual block each: milliseconds
per step on a CPU. Tests add what they check (attention, diffusion steps, batch, intervals,
workers) after these. Importable from every test module: pytest puts ``tests/`` on
``sys.path`` for ``tests/conftest.py``.
"""

from __future__ import annotations

from typing import Any

import torch


def tiny_model(*, image_size: int = 16, attention: str = "") -> list[str]:
    """Overrides for the tiny UNet: ``attention`` is ``model.attention_resolutions`` ("" none,
    "8": self-attention at 8x8)."""
    return [
        f"model.image_size={image_size}",
        "model.in_channels=1",
        "model.num_channels=32",
        "model.channel_mult=1,2",
        "model.num_res_blocks=1",
        f"model.attention_resolutions={attention}",
    ]


def tiny_classifier(*, image_size: int = 16, num_classes: int = 10) -> list[str]:
    """Overrides for a tiny noisy classifier (``train.task=classifier``) of 1-channel images:
    32 channels, two levels of one residual block, the attention head at the smallest level."""
    return [
        "train.task=classifier",
        f"model.image_size={image_size}",
        "model.in_channels=1",
        f"model.num_classes={num_classes}",
        "model.channel_mult=1,2",  # the model section is checked as a UNet's at any task
        "model.attention_resolutions=",
        "classifier.classifier_width=32",
        "classifier.classifier_depth=1",
        "classifier.classifier_channel_mult=1,2",
        f"classifier.classifier_attention_resolutions={image_size // 2}",
        "classifier.classifier_num_head_channels=32",
        "optim.ema_rate=",
    ]


def tiny_unet(
    num_classes: int | None = None,
    *,
    network: type | None = None,
    channel_mult: tuple[int, ...] = (1, 2),
) -> torch.nn.Module:
    """An 8x8x1 UNet (``network``: ``SuperResModel`` for an upsampler) in eval mode, with no
    zero layers: a fresh UNet's zero-initialised layers (every residual branch's last conv, the
    output conv) would make it predict 0 whatever x, t and y, so they get small weights."""
    from raydiff.core import UNetModel

    torch.manual_seed(0)
    model = (network or UNetModel)(
        image_size=8,
        in_channels=1,
        model_channels=32,
        out_channels=1,
        num_res_blocks=1,
        attention_resolutions=(),
        channel_mult=channel_mult,
        num_classes=num_classes,
    )
    with torch.no_grad():
        for param in model.parameters():
            if not param.any():
                param.normal_(std=0.05)
    return model.eval()


class TinyFeatures(torch.nn.Module):
    """A random conv feature extractor with Inception's interface (uint8 [B, 3, H, W]): what
    ``raydiff.evaluate.fid.load_inception`` is replaced by where no weights file is at hand."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x.float() / 255).mean(dim=(2, 3))


TINY_STEP_BATCH = 8


def tiny_rank_optimizer(
    *, compiled: bool, precision: str = "fp32", device: str = "cpu", ddp: bool = False
) -> Any:
    """A ``RankOptimizer`` of the tiny 8x8 UNet with what a compiled step must keep working: two
    microbatches, gradient clipping (0.05: it acts on every step) and the loss-aware sampler (4
    timesteps, 2 losses of history each: importance weights from the second step on).
    ``ddp``: the step calls the model wrapped in DDP (a process group must be up), as on
    several workers."""
    from raydiff.config import (
        DiffusionConfig,
        ExperimentConfig,
        OptimConfig,
        TrainConfig,
        apply_overrides,
    )
    from raydiff.core import LossSecondMomentResampler
    from raydiff.factory import create_gaussian_diffusion, create_model
    from raydiff.train.rank_optimizer import RankOptimizer
    from raydiff.train.tasks.diffusion import DiffusionTask
    from raydiff.train.validation import stratified_timesteps

    model_config = apply_overrides(ExperimentConfig(), tiny_model(image_size=8)).model
    diffusion = create_gaussian_diffusion(
        DiffusionConfig(diffusion_steps=4, noise_schedule="cosine")
    )
    torch.manual_seed(0)
    model = create_model(model_config, learn_sigma=False).to(device)
    task = DiffusionTask(
        model=model, diffusion=diffusion, eval_timesteps=stratified_timesteps(4, 2, seed=0)
    )
    wrapped = torch.nn.parallel.DistributedDataParallel(model) if ddp else model
    return RankOptimizer(
        model=wrapped,
        raw_model=model,
        losses=task.losses,
        sampler=LossSecondMomentResampler(diffusion, history_per_term=2, seed=0),
        optim=OptimConfig(lr=1e-3, grad_clip=0.05),
        train=TrainConfig(
            batch_size=TINY_STEP_BATCH, microbatch=TINY_STEP_BATCH // 2, precision=precision
        ),
        local_batch_size=TINY_STEP_BATCH,
        device=torch.device(device),
        compile_step=compiled,
    )


def tiny_batches(count: int) -> list[dict[str, torch.Tensor]]:
    """``count`` batches of 8x8x1 images for :func:`tiny_rank_optimizer`."""
    g = torch.Generator().manual_seed(1)
    return [
        {
            "x": torch.rand(TINY_STEP_BATCH, 1, 8, 8, generator=g) * 2 - 1,
            "index": torch.arange(TINY_STEP_BATCH),
        }
        for _ in range(count)
    ]
