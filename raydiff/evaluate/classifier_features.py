"""A raydiff-trained clean classifier as a feature extractor and evaluator: sample quality measured
on this machine without downloaded weights.

MNIST-scale papers measure FID-like distances in the features of a classifier trained on the
domain, as Inception's are meaningless for 28x28 greyscale clothing. raydiff's is an evaluator
trained with ``raydiff train-classifier --config evaluator_demo`` (``classifier.noised: false``):
its penultimate features (``EncoderUNetModel.features``, at t = 0) replace Inception's in
``raydiff evaluate fid --features CHECKPOINT``, whose results are named ``fd_classifier`` and
``kd_classifier`` (never FID), and its predictions give ``raydiff evaluate accuracy``. No Ray.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from raydiff.errors import UserInputError
from raydiff.storage import StoragePath

logger = logging.getLogger(__name__)


class ClassifierFeatures(torch.nn.Module):
    """A clean classifier with the FID Inception's interface: uint8 ``[B, 3, H, W]`` (grey
    images repeated to 3 channels by ``extract_features``) -> penultimate features ``[B, D]``.

    ``extractor_name`` keys the reference-feature cache (with a digest of the weights), so its
    cached features are never taken for Inception's or another classifier's.
    """

    extractor_name = "classifier"
    distance_name = "FD in classifier features"

    def __init__(self, network: torch.nn.Module, *, in_channels: int, image_size: int) -> None:
        super().__init__()
        self.network = network.eval()
        self.in_channels = in_channels
        self.image_size = image_size

    def prepare(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 ``[B, 3, H, W]`` -> the classifier's input in [-1, 1] (its own channels)."""
        if images.shape[-1] != self.image_size or images.shape[-2] != self.image_size:
            raise UserInputError(
                f"the classifier takes {self.image_size}x{self.image_size} images, got "
                f"{images.shape[-2]}x{images.shape[-1]}"
            )
        x = images.float() / 127.5 - 1
        return x[:, : self.in_channels] if self.in_channels == 1 else x

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.prepare(images)
        t = torch.zeros(len(x), dtype=torch.long, device=x.device)
        return self.network.features(x, t).float()

    def predict(self, images: torch.Tensor) -> torch.Tensor:
        """The predicted class of each uint8 ``[B, 3, H, W]`` image."""
        x = self.prepare(images)
        t = torch.zeros(len(x), dtype=torch.long, device=x.device)
        return self.network(x, t).argmax(dim=-1)


def load_classifier_features(
    checkpoint: str | StoragePath, *, flag: str = "--features"
) -> ClassifierFeatures:
    """The clean classifier of a ``raydiff train-classifier`` checkpoint as an extractor. A noisy
    classifier is refused: it is the kind of network that guides samples, and an evaluator must
    not be the network that guided them (nor share its blind spots)."""
    from raydiff.sample.classifier import load_classifier

    loaded = load_classifier(checkpoint, flag=flag)
    if loaded.config.classifier.noised:
        raise UserInputError(
            f"{flag} {checkpoint} is a noisy classifier (classifier.noised=true), the kind "
            "that guides sampling: evaluate with a clean one (raydiff train-classifier "
            "--config evaluator_demo), never the network that guided the samples"
        )
    model = loaded.config.model
    return ClassifierFeatures(
        loaded.network, in_channels=model.in_channels, image_size=model.image_size
    )


def classifier_accuracy(
    evaluator: ClassifierFeatures, images: np.ndarray, labels: np.ndarray, *, batch_size: int = 256
) -> float:
    """The fraction of uint8 ``[N, H, W, C]`` ``images`` that ``evaluator`` classifies as their
    ``labels``."""
    if len(images) != len(labels):
        raise UserInputError(f"{len(images)} images but {len(labels)} labels")
    device = next(evaluator.parameters()).device
    correct = 0
    with torch.no_grad():
        for start in range(0, len(images), batch_size):
            batch = torch.from_numpy(images[start : start + batch_size]).permute(0, 3, 1, 2)
            if batch.shape[1] == 1:
                batch = batch.repeat(1, 3, 1, 1)
            predicted = evaluator.predict(batch.to(device)).cpu()
            correct += int(
                (predicted == torch.from_numpy(labels[start : start + batch_size])).sum()
            )
    return correct / len(images)
