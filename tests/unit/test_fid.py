"""FID/KID: agreement with torch-fidelity's own pipeline, the math against closed forms, every
image source, the reference cache, the Inception weights file (never downloaded) and the
refusals. No Ray, and no real Inception weights: a small random conv net stands in for the
extractor, and a zero-weight file for the weights."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from raydiff.data import PrepareOptions, prepare_dataset
from raydiff.data.image_sources import load_images
from raydiff.data.in_memory import load_split_tensors
from raydiff.errors import UserInputError
from raydiff.evaluate.fid import KID_SEED, compute_fid, frechet_distance, kernel_inception_distance
from raydiff.evaluate.inception import (
    INCEPTION_ENV,
    INCEPTION_WEIGHTS_FILE,
    INCEPTION_WEIGHTS_URL,
    extract_features,
    extractor_id,
    import_torch_fidelity,
    load_inception,
)
from raydiff.evaluate.reference_cache import REFERENCE_CACHE_DIR

pytestmark = pytest.mark.unit


class TinyFeatures(torch.nn.Module):
    """A random conv net with torch-fidelity's input convention (uint8 [B, 3, H, W])."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
        self.num_images = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.dtype == torch.uint8 and x.shape[1] == 3
        self.num_images += len(x)
        h = torch.relu(self.conv(x.float() / 127.5 - 1))
        return torch.cat([h.mean(dim=(2, 3)), h.amax(dim=(2, 3))], dim=1)  # [B, 16]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared 16x16 grey dataset: 72 train and 8 val rows."""
    root = tmp_path_factory.mktemp("fid_data")
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (80, 16, 16), np.uint8)
    np.savez(root / "source.npz", base, np.arange(80) % 4)
    prepare_dataset(
        PrepareOptions(
            source=str(root / "source.npz"),
            out=str(root / "dataset"),
            image_size=16,
            channels=1,
            val_count=8,
            shard_max_rows=16,
            num_workers=1,
            progress=False,
        )
    )
    return root / "dataset"


# ---------------------------------------------------------------------------------------------
# agreement with torch-fidelity


class UInt8Images(torch.utils.data.Dataset):
    """torch-fidelity's input: one uint8 [3, H, W] tensor per item."""

    def __init__(self, images: np.ndarray) -> None:
        self.images = torch.from_numpy(images).permute(0, 3, 1, 2).expand(-1, 3, -1, -1)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.images[index]


def tiny_torch_fidelity_extractor() -> type:
    """TinyFeatures as a torch-fidelity feature extractor (its registry's interface), float64
    out, so that both pipelines see the very same features."""
    base = import_torch_fidelity().FeatureExtractorBase

    class TinyExtractor(base):
        def __init__(self, name: str, features_list: list[str], **kwargs: object) -> None:
            super().__init__(name, features_list)
            self.net = TinyFeatures()

        @staticmethod
        def get_provided_features_list() -> tuple[str, ...]:
            return ("tiny",)

        @staticmethod
        def get_default_feature_layer_for_metric(metric: str) -> str:
            return "tiny"

        @staticmethod
        def can_be_compiled() -> bool:
            return False

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
            return (self.net(x).double(),)

    return TinyExtractor


def test_fid_and_kid_agree_with_torch_fidelitys_calculate_metrics(
    dataset: Path, tmp_path: Path
) -> None:
    """raydiff's path (an npz and a prepared dataset, its adapter, its extraction, its cache)
    against torch-fidelity's whole pipeline on the same images and the same network."""
    torch_fidelity = import_torch_fidelity()
    name = "raydiff-test-tiny"
    if name not in torch_fidelity.registry.FEATURE_EXTRACTORS_REGISTRY:
        torch_fidelity.register_feature_extractor(name, tiny_torch_fidelity_extractor())
    reference = load_images(dataset, split="train")
    samples = np.clip(reference.astype(int)[::-1] + 40, 0, 255).astype(np.uint8)
    np.savez(tmp_path / "samples.npz", samples)

    class Float64Features(TinyFeatures):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x).double()

    ours = compute_fid(
        samples=tmp_path / "samples.npz",
        reference=dataset,
        split="train",
        extractor=Float64Features(),
        kid_subsets=10,
        kid_subset_size=50,
    )
    theirs = torch_fidelity.calculate_metrics(
        input1=UInt8Images(samples),
        input2=UInt8Images(reference),
        feature_extractor=name,
        fid=True,
        kid=True,
        kid_subsets=10,
        kid_subset_size=50,
        rng_seed=KID_SEED,
        cuda=False,
        cache=False,
        save_cpu_ram=True,
        verbose=False,
    )
    assert ours["fid"] > 0.1 and ours["kid_mean"] > 0
    assert ours["fid"] == pytest.approx(theirs["frechet_inception_distance"], rel=1e-6)
    assert ours["kid_mean"] == pytest.approx(theirs["kernel_inception_distance_mean"], rel=1e-6)
    assert ours["kid_std"] == pytest.approx(theirs["kernel_inception_distance_std"], rel=1e-6)


# ---------------------------------------------------------------------------------------------
# math


def closed_form_fid(mu1: np.ndarray, s1: np.ndarray, mu2: np.ndarray, s2: np.ndarray) -> float:
    """||mu1 - mu2||^2 + Tr(S1 + S2 - 2 (S1 S2)^{1/2}) for S1, S2 with the eigenvalues s1, s2 in a
    shared eigenbasis (commuting): (S1 S2)^{1/2} then has the eigenvalues sqrt(s1 s2)."""
    return float(np.sum((mu1 - mu2) ** 2) + np.sum(s1 + s2 - 2 * np.sqrt(s1 * s2)))


def test_identical_features_give_zero_fid_and_near_zero_kid() -> None:
    rng = np.random.default_rng(0)
    features = rng.normal(size=(300, 8))
    assert frechet_distance(features, features) == pytest.approx(0.0, abs=1e-9)
    same = kernel_inception_distance(features, features, num_subsets=4)[0]
    independent = kernel_inception_distance(features, rng.normal(size=(300, 8)), num_subsets=4)[0]
    shifted = kernel_inception_distance(features, features + 0.5, num_subsets=4)[0]
    # Unbiased, so ~0 rather than 0: the same set pairs each image with itself, which leaves
    # -O(k(x, x) / m) (here 5% of the shifted value).
    assert abs(same) < 0.1 * shifted and abs(independent) < 0.1 * shifted


def test_fid_of_gaussian_samples_approaches_the_closed_form() -> None:
    rng = np.random.default_rng(2)
    mu1, mu2 = np.array([0.0, 1.0, -1.0]), np.array([0.5, 0.0, -1.0])
    s1, s2 = np.array([1.0, 2.0, 0.5]), np.array([3.0, 0.5, 0.5])
    n = 200_000
    x = mu1 + rng.normal(size=(n, 3)) * np.sqrt(s1)
    y = mu2 + rng.normal(size=(n, 3)) * np.sqrt(s2)
    fid = frechet_distance(x, y)
    assert fid == pytest.approx(closed_form_fid(mu1, s1, mu2, s2), rel=0.02)


def test_kid_is_the_unbiased_mmd_with_the_cubic_kernel() -> None:
    """One subset of all images (any order) against the estimator written out term by term."""
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(12, 4)), rng.normal(size=(12, 4)) + 0.3
    m, d = len(x), x.shape[1]

    def k(a: np.ndarray, b: np.ndarray) -> float:
        return (a @ b / d + 1) ** 3

    within = sum(k(x[i], x[j]) + k(y[i], y[j]) for i in range(m) for j in range(m) if i != j)
    cross = sum(k(x[i], y[j]) for i in range(m) for j in range(m))
    expected = within / (m * (m - 1)) - 2 * cross / m**2
    mean, std = kernel_inception_distance(x, y, num_subsets=3, subset_size=1000)
    assert mean == pytest.approx(expected, rel=1e-10)
    assert std == pytest.approx(0.0, abs=1e-12)  # every subset is the whole set
    assert kernel_inception_distance(x, y, num_subsets=5, subset_size=6, seed=7) == (
        kernel_inception_distance(x, y, num_subsets=5, subset_size=6, seed=7)
    )


# ---------------------------------------------------------------------------------------------
# sources, features, compute_fid


def test_dataset_images_are_the_exact_uint8_pixels(dataset: Path) -> None:
    images = load_images(dataset, split="train")
    x, _, _ = load_split_tensors(str(dataset), "train")
    assert images.dtype == np.uint8 and images.shape == (72, 16, 16, 1)
    np.testing.assert_array_equal(images, np.rint((x.numpy() + 1) * 127.5).transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(load_images(dataset, split="train", limit=20), images[:20])


def test_grey_images_reach_the_extractor_as_three_equal_channels() -> None:
    seen: list[torch.Tensor] = []

    class Recorder(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(x)
            return x.flatten(1).double()

    grey = np.random.default_rng(0).integers(0, 256, (5, 4, 4, 1), np.uint8)
    features = extract_features(Recorder(), grey, batch_size=2)
    assert [tuple(b.shape) for b in seen] == [(2, 3, 4, 4), (2, 3, 4, 4), (1, 3, 4, 4)]
    assert all(b.dtype == torch.uint8 and bool((b == b[:, :1]).all()) for b in seen)
    assert features.dtype == np.float64 and features.shape == (5, 48)


def test_compute_fid_on_npz_png_folder_and_dataset(dataset: Path, tmp_path: Path) -> None:
    extractor = TinyFeatures()
    train = load_images(dataset, split="train")
    np.savez(tmp_path / "samples.npz", train)
    folder = tmp_path / "pngs"
    folder.mkdir()
    for i, image in enumerate(train):
        Image.fromarray(image[..., 0]).save(folder / f"sample_{i:06d}.png")
    brighter = np.clip(train.astype(int) + 60, 0, 255).astype(np.uint8)
    np.savez(tmp_path / "brighter.npz", brighter)

    def fid(samples: Path, reference: Path) -> dict[str, float]:
        return compute_fid(
            samples=samples, reference=reference, split="train", extractor=extractor, kid_subsets=5
        )

    same = [fid(tmp_path / "samples.npz", dataset), fid(folder, dataset), fid(folder, folder)]
    for result in same:
        assert result["fid"] == pytest.approx(0.0, abs=1e-8)
        assert (result["precision"], result["recall"]) == (1.0, 1.0)
        assert result["num_samples"] == result["num_reference"] == 72
    other = fid(tmp_path / "brighter.npz", dataset)
    assert other["fid"] > 0.1 and other["kid_mean"] > 10 * abs(same[0]["kid_mean"])
    assert set(other) == {
        "fid", "kid_mean", "kid_std", "precision", "recall", "num_samples", "num_reference",
    }  # fmt: skip
    assert other["precision"] < 1.0
    limited = compute_fid(
        samples=tmp_path / "samples.npz",
        reference=dataset,
        split="val",
        num_images=5,
        extractor=extractor,
        kid_subsets=2,
    )
    assert limited["num_samples"] == 5 and limited["num_reference"] == 5
    assert limited["precision"] is not None
    three = compute_fid(
        samples=tmp_path / "samples.npz", reference=dataset, split="val", num_images=3,
        extractor=extractor, kid_subsets=2,
    )  # fmt: skip
    # k = 3 nearest neighbours need 4 images a side: no precision or recall, FID and KID still.
    assert three["precision"] is None and three["recall"] is None and three["fid"] >= 0


def test_reference_features_are_cached_once_and_reused(
    dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    extractor = TinyFeatures()
    np.savez(tmp_path / "samples.npz", load_images(dataset, split="val"))
    kwargs = {"samples": tmp_path / "samples.npz", "reference": dataset, "split": "val"}
    first = compute_fid(**kwargs, extractor=extractor, kid_subsets=2)
    cache = dataset / REFERENCE_CACHE_DIR / f"val_8_{extractor_id(extractor)}.npz"
    assert cache.is_file() and extractor.num_images == 16  # samples + reference
    assert not [p.name for p in cache.parent.iterdir() if p.name.startswith(".")]  # temporaries
    written = cache.stat().st_mtime_ns

    with caplog.at_level(logging.INFO, logger="raydiff.evaluate.reference_cache"):
        second = compute_fid(**kwargs, extractor=extractor, kid_subsets=2)
    assert extractor.num_images == 24  # only the samples again
    assert second == first and cache.stat().st_mtime_ns == written
    assert "using cached reference statistics" in caplog.text
    # Another extractor (other weights) gets a file of its own.
    other = TinyFeatures()
    with torch.no_grad():
        other.conv.bias.add_(1.0)
    assert extractor_id(other) != extractor_id(extractor)


# ---------------------------------------------------------------------------------------------
# the Inception weights


def test_missing_weights_name_the_file_the_url_and_where_to_put_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(INCEPTION_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(UserInputError) as default:
        load_inception(None)
    message = str(default.value)
    for part in (INCEPTION_WEIGHTS_FILE, INCEPTION_WEIGHTS_URL, "--inception", INCEPTION_ENV):
        assert part in message
    assert str(tmp_path / ".cache" / "raydiff" / INCEPTION_WEIGHTS_FILE) in message
    with pytest.raises(UserInputError, match=r"--inception /nowhere/w\.pth"):
        load_inception("/nowhere/w.pth")
    monkeypatch.setenv(INCEPTION_ENV, str(tmp_path / "elsewhere.pth"))
    with pytest.raises(UserInputError, match=f"{INCEPTION_ENV}="):
        load_inception(None)
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(UserInputError, match="not a PyTorch state dict"):
        load_inception(tmp_path / "junk.pth")
    torch.save({"w": torch.zeros(2)}, tmp_path / "other.pth")
    with pytest.raises(UserInputError, match="does not hold the FID Inception weights"):
        load_inception(tmp_path / "other.pth")


def test_torch_fidelity_inception_loads_a_local_file_and_never_downloads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch-fidelity's own network, from a zero-weight file with the real keys and shapes."""
    module = import_torch_fidelity().feature_extractor_inceptionv3
    assert module.URL_INCEPTION_V3 == INCEPTION_WEIGHTS_URL
    assert INCEPTION_WEIGHTS_URL.endswith("/" + INCEPTION_WEIGHTS_FILE)

    def no_download(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch-fidelity tried to download the Inception weights")

    monkeypatch.setattr(module, "load_state_dict_from_url", no_download)
    # A weights file with the real keys and shapes: build the network without loading (and
    # without the slow random init), then save zeros.
    empty = tmp_path / "empty.pth"
    torch.save({}, empty)
    with monkeypatch.context() as build:
        build.setattr(module.FeatureExtractorInceptionV3, "load_state_dict", lambda *a, **k: None)
        for init in ("kaiming_uniform_", "uniform_", "normal_", "trunc_normal_"):
            build.setattr(torch.nn.init, init, lambda tensor, *a, **k: tensor)
        network = module.FeatureExtractorInceptionV3(
            "inception-v3-compat", ["2048"], feature_extractor_weights_path=str(empty)
        )
    weights = tmp_path / INCEPTION_WEIGHTS_FILE
    torch.save({k: torch.zeros_like(v) for k, v in network.state_dict().items()}, weights)

    monkeypatch.setenv(INCEPTION_ENV, str(tmp_path))  # a folder: the standard name inside
    extractor = load_inception(None)
    images = np.zeros((1, 8, 8, 1), np.uint8)
    features = extract_features(extractor, images)
    assert features.shape == (1, 2048)
    assert extractor_id(extractor).startswith("inception-2015-12-05-")


# ---------------------------------------------------------------------------------------------
# refusals


def test_bad_sources_are_refused_with_the_reason(dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="does not exist"):
        load_images(tmp_path / "missing.npz")
    np.savez(tmp_path / "named.npz", images=np.zeros((2, 4, 4, 3), np.uint8))
    with pytest.raises(UserInputError, match="has no arr_0 \\(it holds: images\\)"):
        load_images(tmp_path / "named.npz")
    np.savez(tmp_path / "float.npz", np.zeros((2, 4, 4, 3), np.float32))
    with pytest.raises(UserInputError, match="arr_0 is float32"):
        load_images(tmp_path / "float.npz")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no images here")
    with pytest.raises(UserInputError, match="holds no PNG or JPEG images"):
        load_images(tmp_path / "empty")
    with pytest.raises(UserInputError, match="has no split 'test'; its splits: train, val"):
        load_images(dataset, split="test")
    with pytest.raises(UserInputError, match="limit=0 is invalid"):
        load_images(dataset, limit=0)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    Image.new("RGB", (4, 4)).save(mixed / "a.png")
    Image.new("RGB", (5, 4)).save(mixed / "b.png")
    with pytest.raises(UserInputError, match="must have one size"):
        load_images(mixed)
    with pytest.raises(UserInputError, match=r"reference .* does not exist"):
        compute_fid(samples=dataset, reference=tmp_path / "nope", extractor=TinyFeatures())
    with pytest.raises(UserInputError, match=r"is not an \.npz file or a folder"):
        load_images(mixed / "a.png")
    with pytest.raises(UserInputError, match="has no split 'test'"):
        compute_fid(samples=dataset, reference=dataset, extractor=TinyFeatures())
