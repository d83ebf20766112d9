"""guided-diffusion's noisy classifier as a task of the loop (its ``classifier_train.py`` script).

An ``EncoderUNetModel`` learns ``p(y | x_t, t)``: cross-entropy of the labels on
``x_t = q_sample(x_0, t)`` at timesteps drawn by the run's timestep sampler (uniform by default,
as there), or on the clean images at t = 0 with ``classifier.noised=false`` (an evaluator for
sample quality). ADM (Dhariwal & Nichol 2021, sec. 4) uses the noisy one's gradient
``grad_x log p(y | x_t, t)`` to guide sampling. Accuracy is logged as guided-diffusion's
``log_loss_dict`` does: ``acc@1`` and ``acc@5`` per sample, so the loop logs them overall and per
quarter of t. No preview: a classifier draws no images.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from raydiff.config import ExperimentConfig
from raydiff.core.gaussian_diffusion import GaussianDiffusion
from raydiff.factory import create_classifier, create_gaussian_diffusion
from raydiff.train.runtime import Batch, ValBatches
from raydiff.train.task import Metric, TaskSpec

TERMS = ("loss", "acc@1", "acc@5")
"""The per-sample terms, as guided-diffusion logs them."""

MAX_CROP_ZOOM = 1.25
"""guided-diffusion's ``random_crop_arr`` crops S x S out of the image resized to a side in
[S, S / 0.8]: a zoom of at most 1 / 0.8."""


def classification_terms(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-sample cross-entropy and top-1 / top-5 hits (1.0 or 0.0; top-k of k >= the class
    count always hits)."""
    logits = logits.float()
    top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
    hits = top == labels[:, None]
    return {
        "loss": F.cross_entropy(logits, labels, reduction="none"),
        "acc@1": hits[:, :1].any(dim=-1).float(),
        "acc@5": hits.any(dim=-1).float(),
    }


def random_resized_crop(
    x: torch.Tensor, *, seeds: Sequence[int], max_zoom: float = MAX_CROP_ZOOM
) -> torch.Tensor:
    """Each image resized to a random side in [S, ceil(S * max_zoom)] (bicubic, clamped to
    [-1, 1]) and cropped back to S x S at a random place: guided-diffusion's training crop on
    images that are already S x S. Image i's side and place are drawn from ``seeds[i]`` alone
    (the trainer's per-row ``augment_seed``), so a row's crop does not depend on the batch it
    is in."""
    size = x.shape[-1]
    largest = math.ceil(size * max_zoom)
    if len(seeds) != len(x):
        raise ValueError(f"{len(seeds)} seeds for {len(x)} images")
    out = []
    for image, seed in zip(x, seeds, strict=True):
        generator = torch.Generator().manual_seed(seed)
        side = int(torch.randint(size, largest + 1, (1,), generator=generator))
        if side != size:
            image = F.interpolate(image[None], size=(side, side), mode="bicubic")[0]
            top, left = torch.randint(0, side - size + 1, (2,), generator=generator).tolist()
            image = image[:, top : top + size, left : left + size].clamp(-1, 1)
        out.append(image)
    return torch.stack(out)


@dataclass(kw_only=True, eq=False)
class ClassifierTask:
    """A classifier of ``x_t`` (or of clean images) trained on the data's labels ``y``.

    :param noised: train and evaluate on ``q_sample``'d images at the sampled t (else t = 0).
    :param random_crop: apply :func:`random_resized_crop` to training batches.
    """

    model: torch.nn.Module
    diffusion: GaussianDiffusion
    noised: bool
    random_crop: bool
    preview_columns = None  # no preview

    @classmethod
    def from_config(cls, config: ExperimentConfig) -> ClassifierTask:
        """The classifier section's network; its noise is the diffusion section's schedule (the
        one of the diffusion model it will guide)."""
        return cls(
            model=create_classifier(config),
            diffusion=create_gaussian_diffusion(config.diffusion),
            noised=config.classifier.noised,
            random_crop=config.classifier.random_crop,
        )

    def inputs(
        self, x: torch.Tensor, t: torch.Tensor, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x_t, t)`` the classifier sees: the noised images, or the clean ones at t = 0."""
        if not self.noised:
            return x, torch.zeros_like(t)
        return self.diffusion.q_sample(x, t, noise=noise), t

    def losses(
        self, model: torch.nn.Module, batch: Batch, t: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Cross-entropy and hits of ``batch["y"]`` on the (cropped) batch at ``t``."""
        x = batch["x"]
        if self.random_crop:
            x = random_resized_crop(x, seeds=batch["augment_seed"].tolist())
        x_t, t = self.inputs(x, t, batch.get("noise"))
        return classification_terms(model(x_t, t), batch["y"])

    def evaluate(
        self, model: torch.nn.Module, batches: ValBatches, *, seed: int
    ) -> dict[str, torch.Tensor]:
        """Sums of the terms over the val images, overall, per quarter of t and at t = 0. Each
        image's t and noise come from ``seed``: the same draw at every evaluation. Every total
        is there, zero, without batches (a rank with no val images): all ranks sum the same
        keys."""
        generator = torch.Generator().manual_seed(seed)
        num_timesteps = self.diffusion.num_timesteps
        totals = {name: torch.zeros((), dtype=torch.float64) for name in self.total_names()}
        for x, cond in batches:
            t = torch.randint(0, num_timesteps, (len(x),), generator=generator).to(x.device)
            noise = torch.randn(x.shape, generator=generator).to(x.device)
            x_t, t = self.inputs(x, t, noise)
            terms = classification_terms(model(x_t, t), cond["y"])
            quarter = (4 * t // num_timesteps).clamp(max=3)
            _add(totals, "count", torch.ones_like(terms["loss"]))
            for q in range(4):
                _add(totals, f"count_q{q}", (quarter == q).double())
            for name, values in terms.items():
                _add(totals, name, values)
                for q in range(4):
                    _add(totals, f"{name}_q{q}", values * (quarter == q))
            if self.noised:  # the clean images too: what the classifier knows at t = 0
                zero = torch.zeros_like(t)
                for name, values in classification_terms(model(x, zero), cond["y"]).items():
                    _add(totals, f"{name}_t0", values)
        return totals

    def total_names(self) -> list[str]:
        """The keys of :meth:`evaluate`'s totals: counts and term sums, overall and per quarter
        of t, and (noised) the terms at t = 0."""
        quarters = [f"_q{q}" for q in range(4)]
        names = ["count", *(f"count{q}" for q in quarters)]
        for term in TERMS:
            names += [term, *(f"{term}{q}" for q in quarters)]
        if self.noised:
            names += [f"{term}_t0" for term in TERMS]
        return names

    def evaluation_metrics(self, totals: dict[str, torch.Tensor]) -> dict[str, float]:
        """``val_loss``, ``val_acc@1``, ``val_acc@5``, the same at t = 0 (``val_acc@1_t0``...)
        and per quarter of t (``val_acc@1_q0``...; quarters without images are left out)."""
        count = float(totals["count"])
        metrics = {}
        for name in TERMS:
            metrics[f"val_{name}"] = float(totals[name]) / count
            # A clean classifier sees t = 0 in every evaluation: its t = 0 figures are these.
            t0 = totals.get(f"{name}_t0", totals[name])
            metrics[f"val_{name}_t0"] = float(t0) / count
            for q in range(4):
                n = float(totals[f"count_q{q}"])
                if n > 0:
                    metrics[f"val_{name}_q{q}"] = float(totals[f"{name}_q{q}"]) / n
        return metrics

    def preview(self, model: torch.nn.Module, *, seed: int) -> None:
        """A classifier draws no images."""
        return None


def _add(totals: dict[str, torch.Tensor], name: str, values: torch.Tensor) -> None:
    # Not in place: the zero starts on the CPU, the sums on the model's device.
    totals[name] = totals[name] + values.double().sum()


def describe_classifier(config: ExperimentConfig) -> str:
    """What the classifier learns, as the start-up line names it."""
    seen = "of x_t" if config.classifier.noised else "at t = 0"
    return f"cross-entropy {seen}, {config.model.num_classes} classes"


def _accuracy(key: str, what: str, *, gauge: str = "", headline: bool = False) -> Metric:
    return Metric(
        key=key,
        description=f"Classifier: {what}",
        display=f"{key} {{:.3f}}",
        gauge=gauge,
        objective="max",
        headline=headline,
    )


CLASSIFIER_METRICS: tuple[Metric, ...] = (
    _accuracy(
        "val_acc@1", "validation top-1 accuracy (x_t)", gauge="val_accuracy_top1", headline=True
    ),
    _accuracy("val_acc@5", "validation top-5 accuracy (x_t)", gauge="val_accuracy_top5"),
    Metric(
        key="val_loss",
        description="Classifier: validation cross-entropy",
        gauge="val_loss",
        objective="min",
        headline=True,
    ),
    _accuracy(
        "val_acc@1_t0",
        "validation top-1 accuracy at t = 0",
        gauge="val_accuracy_top1_t0",
        headline=True,
    ),
    _accuracy("val_acc@5_t0", "validation top-5 accuracy at t = 0"),
    Metric(
        key="loss",
        description="Classifier: training cross-entropy, mean over all workers since the last "
        "report",
        display="loss {:.4f}",
        gauge="loss",
        objective="min",
        headline=True,
    ),
    _accuracy(
        "acc@1",
        "top-1 accuracy on the training batches (x_t)",
        gauge="accuracy_top1",
        headline=True,
    ),
    _accuracy("acc@5", "top-5 accuracy on the training batches (x_t)", gauge="accuracy_top5"),
)
"""A classifier's figures: validation first (every ``eval_interval`` steps), then the training
terms (every ``log_interval``)."""

SPEC = TaskSpec(
    name="classifier",
    build=lambda config, *, runtime: ClassifierTask.from_config(config),
    network=create_classifier,
    describe=describe_classifier,
    usage=lambda checkpoint: (
        f"a classifier guides sampling: raydiff sample --classifier {checkpoint}"
    ),
    metrics=CLASSIFIER_METRICS,
    train_command="train-classifier",
    posthoc_sweep="validation",  # ranked by val_acc@1, its first objective
)
