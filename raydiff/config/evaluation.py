"""The evaluation section: evaluating each new checkpoint while the run trains."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import get_args

from raydiff.config.diffusion import DiffusionConfig
from raydiff.config.field_values import invalid
from raydiff.config.train import Precision
from raydiff.errors import ConfigError


@dataclass(kw_only=True, frozen=True)
class EvaluationConfig:
    """Evaluation of each new checkpoint while the run trains (``raydiff train
    --evaluate-checkpoints``): one Ray actor of its own, beside the training workers, samples
    from the checkpoint's EMA weights and computes the full bound on val images (FID too, given
    Inception weights). Results: RUN/evaluation/ and ``eval/*`` in the run's trackers."""

    every_checkpoint: bool = False
    """Evaluate every checkpoint the run saves, asynchronously."""
    num_samples: int = 64
    """Samples drawn per checkpoint (a grid in the run's trackers, the npz in RUN/evaluation)."""
    sample_respacing: str = "ddim50"
    """Sampler steps: 'ddimN' (DDIM on N steps), 'N' (ancestral on N steps) or '' (all T)."""
    sample_precision: Precision = "auto"
    """The samples' model forward (``raydiff sample --precision``): auto is fp32 on a CPU and bf16
    (fp16 without bf16) on a GPU run's evaluator; fp16 needs ``scaling.use_gpu``. The bound on
    val images is computed in fp32 whatever this says."""
    bpd_images: int = 16
    """Val images whose full bound is computed, T model calls each (0: no bits/dim)."""
    inception: str = ""
    """FID Inception weights file; when set, FID/KID of the samples against the val split."""
    cpus: float = 1.0
    """CPUs reserved for the evaluation actor (on a GPU run it takes one GPU instead)."""

    def __post_init__(self) -> None:
        s = "evaluation"
        if self.num_samples < 1:
            raise invalid(s, "num_samples", self.num_samples, "must be >= 1")
        if self.bpd_images < 0:
            raise invalid(s, "bpd_images", self.bpd_images, "must be >= 0 (0: no bits/dim)")
        if self.cpus <= 0:
            raise invalid(s, "cpus", self.cpus, "must be > 0")
        if self.sample_precision not in get_args(Precision):
            valid = ", ".join(get_args(Precision))
            raise invalid(s, "sample_precision", self.sample_precision, f"valid: {valid}")

    def sampling_diffusion(self, diffusion: DiffusionConfig) -> DiffusionConfig:
        """The run's diffusion respaced for evaluation samples (checks the respacing)."""
        try:
            return dataclasses.replace(diffusion, timestep_respacing=self.sample_respacing)
        except ConfigError as err:
            raise invalid(
                "evaluation", "sample_respacing", self.sample_respacing, err.reason
            ) from None
