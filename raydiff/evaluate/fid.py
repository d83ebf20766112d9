"""FID and KID of generated images against a reference set, with the standard FID Inception.

Numbers that can be compared with published ones need the exact network of the original FID
code: TensorFlow's Inception graph of 2015-12-05, as torch-fidelity ports it to PyTorch
(``FeatureExtractorInceptionV3``, 2048-d pool features, TF1's bilinear resize to 299x299 inside
the network). Its weights are read from a local file only (``load_inception``); nothing is ever
downloaded, because torch-fidelity is always given the file's path.

The statistics are computed here, with torch-fidelity's formulas (its metric modules cannot be
imported without torchvision, see ``_torch_fidelity_inception_module``):

- FID (Heusel et al. 2017, "GANs Trained by a Two Time-Scale Update Rule Converge to a Local Nash
  Equilibrium"): the Fréchet distance of the Gaussians fitted to the two feature sets.
- KID (Bińkowski et al. 2018, "Demystifying MMD GANs"): the unbiased MMD² estimate under the
  cubic polynomial kernel, averaged over random subsets (mean and standard deviation).

Image sources are improved-diffusion's sample ``.npz`` (``arr_0`` uint8 ``[N, H, W, C]``), a
folder of PNG/JPEG files, or a raydiff prepared dataset. A prepared dataset's reference features
are cached in ``<dataset>/fid_reference/`` and reused; the other sources are read each time (they
may be read-only, and a file can change under the same name). No Ray here.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import os
import pickle
import re
import sys
import time
import types
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

from raydiff.data.in_memory import read_split_pixels
from raydiff.data.manifest import MANIFEST_NAME, is_remote, load_manifest
from raydiff.errors import UserInputError, first_line

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "INCEPTION_ENV",
    "INCEPTION_WEIGHTS_FILE",
    "INCEPTION_WEIGHTS_URL",
    "KID_SEED",
    "KID_SUBSETS",
    "KID_SUBSET_SIZE",
    "REFERENCE_CACHE_DIR",
    "GaussianStatistics",
    "InceptionFeatures",
    "compute_fid",
    "default_inception_path",
    "extract_features",
    "extractor_id",
    "feature_statistics",
    "frechet_distance",
    "kernel_inception_distance",
    "load_images",
    "load_inception",
    "reference_features",
    "resolve_inception_path",
]

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
REFERENCE_CACHE_DIR = "fid_reference"
"""Folder inside a prepared dataset that holds its cached reference features."""
DEFAULT_BATCH_SIZE = 64
KID_SUBSETS = 100
"""torch-fidelity's default number of KID subsets."""
KID_SUBSET_SIZE = 1000
"""KID subset size (Bińkowski et al. 2018 and torch-fidelity use 1000); capped at N."""
KID_SEED = 2020
"""torch-fidelity's default ``rng_seed``: the same subsets, so the same KID as torch-fidelity."""

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg"})
_SOURCE_KINDS = "an .npz of samples (arr_0), a folder of PNG/JPEG images or a prepared dataset"


# ---------------------------------------------------------------------------------------------
# the Inception network


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
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, OSError, EOFError, ValueError) as error:
        raise UserInputError(
            f"{weights} is not a PyTorch state dict ({type(error).__name__}: "
            f"{first_line(error)}); expected {INCEPTION_WEIGHTS_FILE} "
            f"from {INCEPTION_WEIGHTS_URL}"
        ) from error
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise UserInputError(
            f"{weights} holds a {type(state).__name__}, not a state dict of tensors; expected "
            f"{INCEPTION_WEIGHTS_FILE} from {INCEPTION_WEIGHTS_URL}"
        )
    del state
    module = _torch_fidelity_inception_module()
    try:
        # Never None here: with None torch-fidelity would download the weights.
        network = module.FeatureExtractorInceptionV3(
            INCEPTION_NAME, ["2048"], feature_extractor_weights_path=str(weights)
        )
    except RuntimeError as error:  # load_state_dict(strict=True): other keys or shapes
        reason = " ".join(str(error).split())
        raise UserInputError(
            f"{weights} does not hold the FID Inception weights ({reason[:300]}); expected "
            f"{INCEPTION_WEIGHTS_FILE} from {INCEPTION_WEIGHTS_URL}"
        ) from error
    logger.info("loaded the FID Inception weights from %s", weights)
    return InceptionFeatures(network).to(device).eval()


def _torch_fidelity_inception_module() -> types.ModuleType:
    """torch-fidelity's ``feature_extractor_inceptionv3`` module, imported without torchvision.

    Why not ``import torch_fidelity``: the package's ``__init__`` imports every extractor and
    metric it has, and those import torchvision (CLIP, VGG16, DINOv2, its datasets). PyPI's
    torchvision wheels are CUDA builds, which fail to import next to a CPU build of torch
    ("operator torchvision::nms does not exist"), and FID needs none of it: the Inception module
    imports torch and three torch-only helper modules of torch-fidelity. Unless the package is
    loaded already, a stand-in parent package with torch-fidelity's ``__path__`` is registered for
    the duration of this one import; a later ``import torch_fidelity`` runs the real ``__init__``,
    which reuses the submodules loaded here (the same files).
    """
    name = "torch_fidelity.feature_extractor_inceptionv3"
    if name in sys.modules:
        return sys.modules[name]
    if "torch_fidelity" in sys.modules:
        return importlib.import_module(name)
    spec = importlib.util.find_spec("torch_fidelity")  # locates the package, runs nothing
    if spec is None or not spec.submodule_search_locations:
        raise UserInputError(
            "FID needs torch-fidelity's Inception network: pip install 'raydiff[eval]' "
            "(torch-fidelity>=0.4)"
        )
    stand_in = types.ModuleType("torch_fidelity")
    stand_in.__path__ = list(spec.submodule_search_locations)
    sys.modules["torch_fidelity"] = stand_in
    try:
        return importlib.import_module(name)
    finally:
        if sys.modules.get("torch_fidelity") is stand_in:
            del sys.modules["torch_fidelity"]


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


# ---------------------------------------------------------------------------------------------
# images


def load_images(source: str | Path, *, split: str = "test", limit: int | None = None) -> np.ndarray:
    """Images of ``source`` as uint8 ``[N, H, W, C]`` (C = 1 or 3), in a fixed order.

    ``source``: improved-diffusion's / raydiff's sample ``.npz`` (``arr_0``), a folder of
    PNG/JPEG files (recursively, sorted by path; modes other than L and RGB become RGB), or a
    prepared dataset (a folder or URI with ``manifest.json``; its ``split``, rows in shard order,
    which prepare shuffled once with its seed, so a prefix is a fixed random subset). ``split``
    is ignored for the other sources. ``limit``: the first N images only.
    """
    if limit is not None and limit < 1:
        raise UserInputError(f"limit={limit} is invalid: must be >= 1 (or None for all images)")
    text = str(source)
    if is_remote(text):
        return _dataset_images(text, split=split, limit=limit)
    path = Path(text.removeprefix("file://")).expanduser()
    if not path.exists():
        raise UserInputError(f"{path} does not exist; expected {_SOURCE_KINDS}")
    if path.is_dir():
        if (path / MANIFEST_NAME).is_file():
            return _dataset_images(str(path), split=split, limit=limit)
        return _folder_images(path, limit=limit)
    if path.suffix.lower() == ".npz":
        return _npz_images(path, limit=limit)
    raise UserInputError(f"{path} is not an .npz file or a folder; expected {_SOURCE_KINDS}")


def _npz_images(path: Path, *, limit: int | None) -> np.ndarray:
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise UserInputError(f"{path} is not a readable .npz file ({error})") from error
    with archive:
        if "arr_0" not in archive.files:
            raise UserInputError(
                f"{path} has no arr_0 (it holds: {', '.join(archive.files) or 'nothing'}); "
                "expected improved-diffusion's sample layout, arr_0 uint8 [N, H, W, C]"
            )
        try:
            images = archive["arr_0"]
        except ValueError as error:  # an object array: would need pickle
            raise UserInputError(f"{path}: arr_0 cannot be read ({error})") from error
    if images.ndim == 3:  # [N, H, W]: grey images without a channel axis
        images = images[..., None]
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise UserInputError(
            f"{path}: arr_0 is {images.dtype} {list(images.shape)}; expected uint8 [N, H, W, C] "
            "with C = 1 or 3 (pixels 0..255, as improved-diffusion's image_sample.py writes)"
        )
    if len(images) == 0:
        raise UserInputError(f"{path}: arr_0 holds no images")
    return images[:limit]


def _folder_images(path: Path, *, limit: int | None) -> np.ndarray:
    files = sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise UserInputError(
            f"{path} holds no PNG or JPEG images (and no {MANIFEST_NAME} of a prepared dataset)"
        )
    files = files[:limit]
    arrays: list[np.ndarray] = []
    for file in files:
        try:
            with Image.open(file) as image:
                array = np.asarray(image if image.mode in ("L", "RGB") else image.convert("RGB"))
        except (OSError, SyntaxError, ValueError) as error:
            raise UserInputError(f"cannot read image {file}: {error}") from error
        if array.ndim == 2:
            array = array[..., None]  # [H, W] -> [H, W, 1]
        if arrays and array.shape[:2] != arrays[0].shape[:2]:
            raise UserInputError(
                f"{file} is {array.shape[1]}x{array.shape[0]} but {files[0]} is "
                f"{arrays[0].shape[1]}x{arrays[0].shape[0]}; the images of a folder must have "
                "one size (for `raydiff sample` output pass its images/ folder or its .npz, "
                "not the folder with grid.png)"
            )
        arrays.append(array)
    if any(a.shape[-1] == 3 for a in arrays):  # some colour: grey ones become RGB too
        arrays = [np.repeat(a, 3, axis=-1) if a.shape[-1] == 1 else a for a in arrays]
    return np.stack(arrays)


def _dataset_images(uri: str, *, split: str, limit: int | None) -> np.ndarray:
    """Decode the PNGs of a prepared split straight to uint8 (no float round trip)."""
    return read_split_pixels(load_manifest(uri), split, limit=limit)[0]


def _check_images(images: np.ndarray, what: str) -> None:
    if not (
        isinstance(images, np.ndarray)
        and images.dtype == np.uint8
        and images.ndim == 4
        and images.shape[-1] in (1, 3)
    ):
        shape = list(getattr(images, "shape", []))
        raise ValueError(
            f"{what} must be uint8 [N, H, W, C] with C = 1 or 3, got "
            f"{getattr(images, 'dtype', type(images).__name__)} {shape}"
        )


# ---------------------------------------------------------------------------------------------
# features


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
    _check_images(images, "images")
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


def reference_features(
    reference: str | Path,
    *,
    extractor: torch.nn.Module,
    split: str = "test",
    num_images: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False,
) -> tuple[np.ndarray, tuple[int, ...]]:
    """Features of the reference images and their image shape ``(H, W, C)``.

    For a local prepared dataset they are cached in
    ``<dataset>/fid_reference/<split>_<n-images>_<extractor-id>.npz`` (written atomically) and
    read back on the next call: Inception features of a 10k-image split cost minutes on a CPU,
    and the reference of an evaluation never changes. A re-prepared dataset is a new folder
    (prepare replaces it whole), so its cache goes with it; the manifest's creation time is
    checked too. Other references (npz, image folders, remote datasets) are not cached.
    """
    text = str(reference)
    local = Path(text.removeprefix("file://")).expanduser()
    if is_remote(text) or not (local / MANIFEST_NAME).is_file():
        images = load_images(reference, split=split, limit=num_images)
        features = extract_features(extractor, images, batch_size=batch_size, progress=progress)
        return features, images.shape[1:]

    manifest = load_manifest(str(local))
    manifest.check_split(split)
    available = manifest.splits[split].num_rows
    num = available if num_images is None else min(num_images, available)
    cache = (
        Path(manifest.root) / REFERENCE_CACHE_DIR / f"{split}_{num}_{extractor_id(extractor)}.npz"
    )
    cached = _read_cache(cache, num_images=num, created_utc=manifest.created_utc)
    if cached is not None:
        logger.info("using cached reference statistics %s (%d images)", cache, num)
        return cached

    images = load_images(local, split=split, limit=num)
    features = extract_features(extractor, images, batch_size=batch_size, progress=progress)
    try:
        _write_cache(
            cache,
            features=features,
            image_shape=images.shape[1:],
            split=split,
            created_utc=manifest.created_utc,
        )
        logger.info("cached the reference features of %d images in %s", len(features), cache)
    except OSError as error:  # a read-only dataset: evaluate all the same
        logger.warning("could not cache the reference features in %s: %s", cache, error)
    return features, images.shape[1:]


def _read_cache(
    path: Path, *, num_images: int, created_utc: str
) -> tuple[np.ndarray, tuple[int, ...]] | None:
    """The cached ``(features, image_shape)``, or None when absent, unreadable or stale."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as archive:
            features = archive["features"].astype(np.float64)
            image_shape = tuple(int(d) for d in archive["image_shape"])
            stored_created = str(archive["created_utc"])
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
        logger.warning("ignoring the unreadable reference cache %s: %s", path, error)
        return None
    if stored_created != created_utc or features.ndim != 2 or len(features) != num_images:
        logger.warning("ignoring the stale reference cache %s", path)
        return None
    return features, image_shape


def _write_cache(
    path: Path,
    *,
    features: np.ndarray,
    image_shape: tuple[int, ...],
    split: str,
    created_utc: str,
) -> None:
    """Write atomically: a temporary file in the same folder, then ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # float32 when lossless (Inception's features are float32): half the size of float64.
    as_float32 = features.astype(np.float32)
    stored = as_float32 if np.array_equal(as_float32, features) else features
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with open(temporary, "wb") as f:
            np.savez(
                f,
                features=stored,
                image_shape=np.asarray(image_shape, dtype=np.int64),
                split=np.asarray(split),
                created_utc=np.asarray(created_utc),
            )
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# metrics


@dataclass(frozen=True, kw_only=True)
class GaussianStatistics:
    """The Gaussian that FID fits to a feature set: mean and covariance."""

    mu: np.ndarray
    """``[D]`` mean of the features."""
    sigma: np.ndarray
    """``[D, D]`` sample covariance (ddof = 1, as TTUR's and torch-fidelity's ``np.cov``)."""
    num_images: int


def feature_statistics(features: np.ndarray) -> GaussianStatistics:
    """Mean and covariance of ``[N, D]`` features (N >= 2)."""
    if features.ndim != 2 or len(features) < 2:
        raise UserInputError(
            f"FID needs the features of at least 2 images, got {list(features.shape)}"
        )
    features = features.astype(np.float64, copy=False)
    return GaussianStatistics(
        mu=features.mean(axis=0),
        sigma=np.cov(features, rowvar=False),
        num_images=len(features),
    )


def frechet_distance(a: GaussianStatistics, b: GaussianStatistics) -> float:
    """FID: the Fréchet distance of two Gaussians (Heusel et al. 2017; Dowson & Landau 1982).

    ``||mu_a - mu_b||^2 + Tr(S_a + S_b - 2 (S_a S_b)^{1/2})``.
    """
    if a.mu.shape != b.mu.shape or a.sigma.shape != b.sigma.shape:
        raise ValueError(f"statistics of different sizes: {a.mu.shape} and {b.mu.shape}")
    diff = a.mu - b.mu
    # Tr((S_a S_b)^{1/2}) is the sum of the square roots of the eigenvalues of S_a S_b, which is
    # similar to S_a^{1/2} S_b S_a^{1/2} (PSD): its eigenvalues are real and >= 0 up to round-off,
    # which the complex square root and .real discard. torch-fidelity's fid_statistics_to_metric
    # (from TTUR's fid.py) computes it so; no scipy.linalg.sqrtm and its "+ eps I" fix needed.
    eigenvalues = np.linalg.eigvals(a.sigma @ b.sigma).astype(np.complex128)
    trace_sqrt = np.sum(np.sqrt(eigenvalues)).real
    return float(diff @ diff + np.trace(a.sigma) + np.trace(b.sigma) - 2 * trace_sqrt)


def kernel_inception_distance(
    features_a: np.ndarray,
    features_b: np.ndarray,
    *,
    num_subsets: int = KID_SUBSETS,
    subset_size: int = KID_SUBSET_SIZE,
    seed: int = KID_SEED,
) -> tuple[float, float]:
    """KID: mean and standard deviation over ``num_subsets`` random subset pairs of the unbiased
    MMD² estimate with the kernel ``k(x, y) = (x·y / D + 1)^3`` (Bińkowski et al. 2018).

    Subsets of ``min(subset_size, N_a, N_b)`` images, drawn without replacement from a
    ``RandomState(seed)`` in torch-fidelity's order (so its ``kid_features_to_metric`` gives the
    same numbers for the same seed); never the global NumPy RNG. Small negative values are
    valid: the estimate is unbiased, and near 0 for matching distributions.
    """
    if num_subsets < 1:
        raise UserInputError(f"num_subsets={num_subsets} is invalid: must be >= 1")
    m = min(subset_size, len(features_a), len(features_b))
    if m < 2:
        raise UserInputError(
            f"KID needs at least 2 images on each side, got {len(features_a)} and {len(features_b)}"
        )
    a = features_a.astype(np.float64, copy=False)
    b = features_b.astype(np.float64, copy=False)
    rng = np.random.RandomState(seed)
    mmds = np.empty(num_subsets)
    for i in range(num_subsets):
        x = a[rng.choice(len(a), m, replace=False)]
        y = b[rng.choice(len(b), m, replace=False)]
        mmds[i] = _mmd2_unbiased(
            _polynomial_kernel(x, x), _polynomial_kernel(x, y), _polynomial_kernel(y, y)
        )
    return float(np.mean(mmds)), float(np.std(mmds))


def _polynomial_kernel(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``(x·y / D + 1)^3``: KID's kernel (Bińkowski et al. 2018, sec. on KID)."""
    base = x @ y.T / x.shape[1] + 1.0
    return base * base * base  # a few times faster than ** 3 (a general pow per element)


def _mmd2_unbiased(k_xx: np.ndarray, k_xy: np.ndarray, k_yy: np.ndarray) -> float:
    """The unbiased estimate MMD²_u of Gretton et al. 2012 ("A Kernel Two-Sample Test") for two
    sets of m: the within-set kernel sums without the diagonal over m(m-1), the cross sum over
    m²."""
    m = k_xx.shape[0]
    within = (k_xx.sum() - np.trace(k_xx) + k_yy.sum() - np.trace(k_yy)) / (m * (m - 1))
    return float(within - 2 * k_xy.sum() / (m * m))


# ---------------------------------------------------------------------------------------------
# the entry point


def compute_fid(
    *,
    samples: str | Path,
    reference: str | Path,
    split: str = "test",
    samples_split: str | None = None,
    inception: str | Path | None = None,
    num_images: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    extractor: torch.nn.Module | None = None,
    device: str | torch.device | None = None,
    kid_subsets: int = KID_SUBSETS,
    kid_subset_size: int = KID_SUBSET_SIZE,
    seed: int = KID_SEED,
    progress: bool = False,
) -> dict[str, float]:
    """FID and KID of ``samples`` against ``reference``; what ``raydiff evaluate fid`` reports.

    ``samples`` / ``reference``: any source of :func:`load_images`; a prepared dataset
    contributes its ``split`` (``samples_split`` for the samples side, default ``split``), and a
    local one caches its reference features (:func:`reference_features`). ``num_images``: the
    first N images of each side (default all). ``extractor``: a feature network taking uint8
    ``[B, 3, H, W]`` (default: the FID Inception from ``inception``, see
    :func:`load_inception`, moved to ``device``: CUDA when available). An injected extractor
    stays on its device.

    :return: ``fid``, ``kid_mean``, ``kid_std``, ``num_samples``, ``num_reference``.
    """
    if num_images is not None and num_images < 1:
        raise UserInputError(f"num_images={num_images} is invalid: must be >= 1 (or None for all)")
    if batch_size < 1:
        raise UserInputError(f"batch_size={batch_size} is invalid: must be >= 1")
    # Paths first: a typo should not wait for a 90 MB network to load.
    for role, source in (("samples", samples), ("reference", reference)):
        text = str(source)
        if not is_remote(text) and not Path(text.removeprefix("file://")).expanduser().exists():
            raise UserInputError(f"{role} {text} does not exist; expected {_SOURCE_KINDS}")
    if extractor is None:
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        extractor = load_inception(inception, device=device)
    started = time.perf_counter()

    sample_images = load_images(samples, split=samples_split or split, limit=num_images)
    sample_features = extract_features(
        extractor, sample_images, batch_size=batch_size, progress=progress
    )
    ref_features, ref_shape = reference_features(
        reference,
        extractor=extractor,
        split=split,
        num_images=num_images,
        batch_size=batch_size,
        progress=progress,
    )
    if sample_images.shape[1:] != ref_shape:
        # Inception resizes both to 299x299 and grey is repeated to RGB, so the metric is
        # defined; but different sizes or channels usually mean the wrong reference.
        logger.warning(
            "samples are %s images but the reference images are %s (H, W, C); check that the "
            "reference is the data the model was trained on",
            "x".join(map(str, sample_images.shape[1:])),
            "x".join(map(str, ref_shape)),
        )
    dims = sample_features.shape[1]
    if min(len(sample_features), len(ref_features)) < dims:
        logger.warning(
            "FID of %d samples and %d reference images with %d-d features: the covariances are "
            "rank-deficient and FID is biased upwards (published FIDs use 10k-50k images)",
            len(sample_features), len(ref_features), dims,
        )  # fmt: skip

    fid = frechet_distance(feature_statistics(sample_features), feature_statistics(ref_features))
    kid_mean, kid_std = kernel_inception_distance(
        sample_features,
        ref_features,
        num_subsets=kid_subsets,
        subset_size=kid_subset_size,
        seed=seed,
    )
    result = {
        "fid": fid,
        "kid_mean": kid_mean,
        "kid_std": kid_std,
        "num_samples": len(sample_features),
        "num_reference": len(ref_features),
    }
    logger.info(
        "FID %.4f, KID %.5f +- %.5f (%d samples, %d reference images, %.1f s)",
        fid, kid_mean, kid_std, len(sample_features), len(ref_features),
        time.perf_counter() - started,
    )  # fmt: skip
    return result
