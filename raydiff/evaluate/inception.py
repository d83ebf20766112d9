"""The standard FID Inception network, torch-fidelity's, read from a local weights file.

Numbers that can be compared with published ones need the exact network of the original FID
code: TensorFlow's Inception graph of 2015-12-05, as torch-fidelity ports it to PyTorch
(``FeatureExtractorInceptionV3``, 2048-d pool features, TF1's bilinear resize to 299x299 inside
the network). Its weights are read from a local file only (:func:`load_inception`): torch-fidelity
is always given the file's path, so it never downloads them. No Ray here.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import re
import sys
import types
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from raydiff.errors import UserInputError, first_line

logger = logging.getLogger(__name__)

INCEPTION_WEIGHTS_FILE = "weights-inception-2015-12-05-6726825d.pth"
"""torch-fidelity's file of the FID Inception weights (its ``URL_INCEPTION_V3``)."""
INCEPTION_WEIGHTS_URL = (
    "https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/" + INCEPTION_WEIGHTS_FILE
)
"""Where torch-fidelity publishes that file (the tests check it against torch-fidelity's)."""
INCEPTION_ENV = "RAYDIFF_INCEPTION"
"""Environment variable naming the weights file when ``--inception`` is not given."""
INCEPTION_NAME = "inception-v3-compat"
"""torch-fidelity's name for this extractor."""
INCEPTION_EXTRACTOR_NAME = "inception-2015-12-05"
"""The first part of the extractor id (cache file names) of the FID Inception."""
DEFAULT_BATCH_SIZE = 64
_NMS_SCHEMA = "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"


def import_torch_fidelity() -> types.ModuleType:
    """The ``torch_fidelity`` package, also where torchvision's compiled operators do not load.

    torch-fidelity imports torchvision at package level (its metric modules import its
    ``utils``, which imports torchvision and every extractor). torchvision's Python part is made
    to import without its compiled operators (they are checked when called), except that its
    ``_meta_registrations`` registers fake kernels for ``torchvision::nms`` and ``qnms``
    unconditionally (pytorch/vision issue 9085). So a CUDA build of torchvision beside a CPU
    build of torch (PyPI serves only CUDA builds of torchvision) fails with "operator
    torchvision::nms does not exist". Only then are those two operators declared, with their
    schemas and no kernel (calling them fails as before; FID calls neither), and the import is
    retried: the real torchvision and torch-fidelity are imported either way. torchvision is
    imported first, alone, so that torch-fidelity's own import runs once, whole.
    """
    try:
        try:
            import torchvision
        except RuntimeError as error:
            if "torchvision::nms does not exist" not in str(error):
                raise
            for operator in ("nms", "qnms"):
                torch.library.define(f"torchvision::{operator}", _NMS_SCHEMA)
            import torchvision  # noqa: F401
        import torch_fidelity
    except ModuleNotFoundError as error:
        raise UserInputError(
            f"FID needs torch-fidelity and torchvision ({error}): pip install 'raydiff[eval]'"
        ) from error
    return torch_fidelity


def default_inception_path() -> Path:
    """``~/.cache/raydiff/weights-inception-2015-12-05-6726825d.pth``."""
    return Path.home() / ".cache" / "raydiff" / INCEPTION_WEIGHTS_FILE


def resolve_inception_path(path: str | Path | None = None) -> Path:
    """The weights file to load: ``path``, else ``$RAYDIFF_INCEPTION``, else the default path.

    A folder stands for the standard file name inside it. Raises :class:`UserInputError` naming
    the file needed, where it is published and the three places it may be put, when it is not
    there: nothing is downloaded at run time, so the user has to fetch it once.
    """
    if path is not None and str(path) != "":
        candidate, given = Path(path).expanduser(), f"--inception {path}"
    elif os.environ.get(INCEPTION_ENV):
        env = os.environ[INCEPTION_ENV]
        candidate, given = Path(env).expanduser(), f"{INCEPTION_ENV}={env}"
    else:
        candidate, given = default_inception_path(), "the default path"
    if candidate.is_dir():
        candidate = candidate / INCEPTION_WEIGHTS_FILE
    if not candidate.is_file():
        raise UserInputError(
            f"the FID Inception weights file {INCEPTION_WEIGHTS_FILE} is not at {candidate} "
            f"({given}); download it once from {INCEPTION_WEIGHTS_URL} (nothing is downloaded "
            f"at run time) and pass --inception PATH, set {INCEPTION_ENV}=PATH, or put it at "
            f"{default_inception_path()}"
        )
    return candidate


class InceptionFeatures(torch.nn.Module):
    """torch-fidelity's FID Inception, returning only the 2048-d pool features.

    Input: uint8 ``[B, 3, H, W]`` of any size (resized to 299x299 inside, as the TF graph does).
    Output: float32 ``[B, 2048]``.
    """

    extractor_name = INCEPTION_EXTRACTOR_NAME

    def __init__(self, network: torch.nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        (features,) = self.network(images)  # torch-fidelity returns one tensor per feature name
        return features


def load_inception(
    path: str | Path | None = None, *, device: str | torch.device = "cpu"
) -> torch.nn.Module:
    """The FID Inception feature extractor (:class:`InceptionFeatures`), in eval mode.

    ``path``: the weights file or a folder holding it; None looks at ``$RAYDIFF_INCEPTION``, then
    ``~/.cache/raydiff/`` (:func:`resolve_inception_path`). The file is first read with
    ``weights_only=True`` (raydiff never unpickles arbitrary objects), then handed to
    torch-fidelity by its path: given a path, torch-fidelity never calls
    ``load_state_dict_from_url`` (its only download), so nothing is fetched at run time.
    """
    weights = resolve_inception_path(path)
    expected = f"expected {INCEPTION_WEIGHTS_FILE} from {INCEPTION_WEIGHTS_URL}"
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, OSError, EOFError, ValueError) as error:
        raise UserInputError(
            f"{weights} is not a PyTorch state dict ({type(error).__name__}: {first_line(error)}); "
            f"{expected}"
        ) from error
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise UserInputError(
            f"{weights} holds a {type(state).__name__}, not a state dict of tensors; {expected}"
        )
    del state
    extractor_class = import_torch_fidelity().FeatureExtractorInceptionV3
    try:
        # Never None here: with None torch-fidelity would download the weights.
        network = extractor_class(
            INCEPTION_NAME, ["2048"], feature_extractor_weights_path=str(weights)
        )
    except RuntimeError as error:  # load_state_dict(strict=True): other keys or shapes
        reason = " ".join(str(error).split())
        raise UserInputError(
            f"{weights} does not hold the FID Inception weights ({reason[:300]}); {expected}"
        ) from error
    logger.info("loaded the FID Inception weights from %s", weights)
    return InceptionFeatures(network).to(device).eval()


def extractor_id(extractor: torch.nn.Module) -> str:
    """A file-name-safe id of ``extractor``: its name and a digest of its weights.

    Part of the reference cache's file name, so that features of other weights (another
    Inception file, an injected test network) are never taken for these.
    """
    name = getattr(extractor, "extractor_name", None) or type(extractor).__name__.lower()
    digest = hashlib.sha256()
    for key, value in sorted(extractor.state_dict().items()):
        digest.update(f"{key}:{tuple(value.shape)}:{value.dtype};".encode())
        raw = value.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        digest.update(raw.numpy().tobytes())
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{name}-{digest.hexdigest()[:12]}")


def extract_features(
    extractor: torch.nn.Module,
    images: np.ndarray,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False,
) -> np.ndarray:
    """``extractor``'s features of uint8 ``[N, H, W, C]`` images as float64 ``[N, D]``.

    The extractor gets uint8 ``[B, 3, H, W]`` batches on its own device (torch-fidelity's input
    convention: it resizes and normalises inside); grey images (C = 1, e.g. Fashion-MNIST) are
    repeated to 3 channels, as the Inception network only takes RGB. The extractor is put in
    eval mode (batch norm must not depend on the batch). ``progress``: a tqdm bar in images/s on
    a terminal.
    """
    if not (
        isinstance(images, np.ndarray)
        and images.dtype == np.uint8
        and images.ndim == 4
        and images.shape[-1] in (1, 3)
    ):
        raise ValueError(
            f"images must be uint8 [N, H, W, C] with C = 1 or 3, got "
            f"{getattr(images, 'dtype', type(images).__name__)} {list(getattr(images, 'shape', []))}"
        )
    if len(images) == 0:
        raise ValueError("no images to extract features from")
    if batch_size < 1:
        raise UserInputError(f"batch_size={batch_size} is invalid: must be >= 1")
    parameter = next(extractor.parameters(), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    extractor.eval()
    chunks: list[np.ndarray] = []
    bar = tqdm(
        total=len(images),
        unit="img",
        desc="features",
        disable=not (progress and sys.stderr.isatty()),
    )
    with bar, torch.inference_mode():
        for start in range(0, len(images), batch_size):
            batch = torch.tensor(images[start : start + batch_size], device=device)
            batch = batch.permute(0, 3, 1, 2)  # [B, H, W, C] -> [B, C, H, W]
            batch = batch.expand(-1, 3, -1, -1).contiguous()  # [B, 3, H, W] (C = 1 repeated)
            features = extractor(batch)
            if not (
                torch.is_tensor(features) and features.ndim == 2 and len(features) == len(batch)
            ):
                raise ValueError(
                    f"the feature extractor must return a [B, D] tensor; for a batch of "
                    f"{len(batch)} it returned {type(features).__name__} "
                    f"{list(getattr(features, 'shape', []))}"
                )
            chunks.append(features.to(device="cpu", dtype=torch.float64).numpy())
            bar.update(len(batch))
    return np.concatenate(chunks)
