"""raydiff prepare: sources, labels, resize rule, bad input and all-or-nothing output (no Ray)."""

from __future__ import annotations

import gzip
import io
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from raydiff.cli import main
from raydiff.data import (
    DataConfig,
    PrepareOptions,
    check_compatible,
    load_manifest,
    prepare_dataset,
    verify_shards,
)
from raydiff.data.collate import normalise
from raydiff.data.order import flip_mask
from raydiff.data.pipeline import decode_batch
from raydiff.data.prepare import BadInputError
from raydiff.data.resize import resize_center_crop, to_channels
from raydiff.data.sources import FASHION_MNIST_DIR, read_idx
from raydiff.errors import UserInputError

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# helpers


def _rng_images(n: int, size: int, channels: int, seed: int = 0) -> np.ndarray:
    shape = (n, size, size) if channels == 1 else (n, size, size, channels)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _read_rows(out: Path) -> dict[str, dict[str, np.ndarray]]:
    """split -> decoded columns, rows in shard order (pixels as uint8 [N, H, W, C])."""
    manifest = load_manifest(str(out))
    result = {}
    for split in manifest.splits:
        tables = [pq.read_table(uri) for uri in manifest.shard_uris(split)]
        keys = [k for t in tables for k in t["key"].to_pylist()]
        labels = np.concatenate([t["label"].to_numpy() for t in tables])
        pngs = [p for t in tables for p in t["png"].to_pylist()]
        pixels = np.stack([np.asarray(Image.open(io.BytesIO(p))) for p in pngs])
        if pixels.ndim == 3:
            pixels = pixels[..., None]
        index = np.concatenate([t["index"].to_numpy() for t in tables])
        result[split] = {"key": np.array(keys), "label": labels, "pixels": pixels, "index": index}
    return result


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def _options(source: Path | str, out: Path, **overrides: object) -> PrepareOptions:
    values: dict[str, object] = {
        "source": str(source),
        "out": str(out),
        "num_workers": 1,
        "val_count": 0,
        "progress": False,
    }
    values.update(overrides)
    return PrepareOptions(**values)  # type: ignore[arg-type]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """12 RGB 8x8 PNGs in two class folders, with improved-diffusion-style name prefixes."""
    root = tmp_path / "images"
    images = _rng_images(12, 8, 3, seed=1)
    for i, array in enumerate(images):
        sub = "cats" if i % 2 == 0 else "dogs"
        prefix = "tabby" if i % 3 == 0 else "plain"
        (root / sub).mkdir(parents=True, exist_ok=True)
        Image.fromarray(array).save(root / sub / f"{prefix}_{i:03d}.png")
    return root


# ---------------------------------------------------------------------------------------------
# sources round-trip


def test_folder_round_trip_is_lossless_and_normalised(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    summary = prepare_dataset(_options(folder, out, image_size=8, channels=3, labels="folder"))
    assert summary.manifest.num_images == 12
    rows = _read_rows(out)["train"]
    for key, pixels in zip(rows["key"], rows["pixels"], strict=True):
        original = np.asarray(Image.open(folder / key))
        assert np.abs(pixels.astype(int) - original.astype(int)).max() <= 1
    # The pipeline's decode gives improved-diffusion's x / 127.5 - 1 in NCHW.
    table = pq.read_table(summary.manifest.shard_uris("train")[0])
    batch = {c: table[c].to_numpy(zero_copy_only=False) for c in table.column_names}
    decoded = decode_batch(batch, image_size=8, channels=3)["image"]
    assert decoded.shape == (12, 3, 8, 8) and decoded.dtype == np.uint8
    np.testing.assert_array_equal(decoded, rows["pixels"].transpose(0, 3, 1, 2))
    x = normalise(decoded)
    assert x.dtype == np.float32 and x.min() >= -1 and x.max() <= 1
    np.testing.assert_array_equal(x, decoded.astype(np.float32) / 127.5 - 1)
    assert normalise(np.array([0, 255], dtype=np.uint8)).tolist() == [-1.0, 1.0]


def test_label_rules(folder: Path, tmp_path: Path) -> None:
    by_folder = prepare_dataset(_options(folder, tmp_path / "f", image_size=8, labels="folder"))
    assert by_folder.manifest.classes == ["cats", "dogs"]
    rows = _read_rows(tmp_path / "f")["train"]
    for key, label in zip(rows["key"], rows["label"], strict=True):
        assert label == (0 if key.startswith("cats/") else 1)

    by_prefix = prepare_dataset(_options(folder, tmp_path / "p", image_size=8, labels="prefix"))
    assert by_prefix.manifest.classes == ["plain", "tabby"]
    rows = _read_rows(tmp_path / "p")["train"]
    for key, label in zip(rows["key"], rows["label"], strict=True):
        assert label == (1 if Path(key).name.startswith("tabby_") else 0)
    assert by_prefix.manifest.splits["train"].class_counts == {"plain": 8, "tabby": 4}

    unlabelled = prepare_dataset(_options(folder, tmp_path / "n", image_size=8))
    assert unlabelled.manifest.classes is None
    assert (_read_rows(tmp_path / "n")["train"]["label"] == -1).all()

    flat = tmp_path / "flat"
    flat.mkdir()
    Image.new("RGB", (8, 8)).save(flat / "a_1.png")
    with pytest.raises(ValueError, match="sub-folder"):
        prepare_dataset(_options(flat, tmp_path / "x", image_size=8, labels="folder"))


def test_idx_pair_round_trip_with_splits(tmp_path: Path) -> None:
    source = tmp_path / "idx"
    source.mkdir()
    train, test = _rng_images(50, 10, 1, seed=2), _rng_images(20, 10, 1, seed=3)
    train_labels, test_labels = np.arange(50) % 4, np.arange(20) % 4
    _write_idx(source / "train-images-idx3-ubyte.gz", train)
    _write_idx(source / "train-labels-idx1-ubyte.gz", train_labels)
    _write_idx(source / "t10k-images-idx3-ubyte.gz", test)
    _write_idx(source / "t10k-labels-idx1-ubyte.gz", test_labels)
    np.testing.assert_array_equal(read_idx(source / "train-images-idx3-ubyte.gz"), train)

    out = tmp_path / "ds"
    summary = prepare_dataset(_options(source, out, image_size=10, val_count=5))
    manifest = summary.manifest
    assert manifest.channels == 1 and manifest.classes == ["0", "1", "2", "3"]
    assert {s: i.num_rows for s, i in manifest.splits.items()} == {
        "train": 45,
        "val": 5,
        "test": 20,
    }
    rows = _read_rows(out)
    for split, originals, labels in (("train", train, train_labels), ("test", test, test_labels)):
        for key, label, pixels in zip(
            *(rows[split][c] for c in ("key", "label", "pixels")), strict=True
        ):
            i = int(key.rsplit(":", 1)[1])
            assert label == labels[i]
            assert np.abs(pixels[..., 0].astype(int) - originals[i].astype(int)).max() <= 1
    # val is held out of train: disjoint, together all 50 train images.
    train_keys, val_keys = set(rows["train"]["key"]), set(rows["val"]["key"])
    assert not train_keys & val_keys and len(train_keys | val_keys) == 50
    # the index column numbers the rows of each split
    assert sorted(rows["train"]["index"]) == list(range(45))


def test_npz_round_trip(tmp_path: Path) -> None:
    images, labels = _rng_images(30, 8, 3, seed=4), np.arange(30) % 3
    np.savez(tmp_path / "samples.npz", images, labels)
    out = tmp_path / "ds"
    manifest = prepare_dataset(_options(tmp_path / "samples.npz", out, image_size=8)).manifest
    assert manifest.channels == 3 and manifest.classes == ["0", "1", "2"]
    rows = _read_rows(out)["train"]
    for key, label, pixels in zip(rows["key"], rows["label"], rows["pixels"], strict=True):
        i = int(key.rsplit(":", 1)[1])
        assert label == labels[i]
        assert np.abs(pixels.astype(int) - images[i].astype(int)).max() <= 1
    # --labels none drops arr_1; a grey npz keeps 1 channel
    np.savez(tmp_path / "grey.npz", _rng_images(5, 8, 1))
    grey = prepare_dataset(
        _options(tmp_path / "grey.npz", tmp_path / "g", image_size=8, labels="none")
    )
    assert grey.manifest.channels == 1 and grey.manifest.classes is None


@pytest.mark.skipif(
    not Path(FASHION_MNIST_DIR).is_dir(), reason="dataset-fashion-mnist not installed"
)
def test_fashion_mnist_embedded(tmp_path: Path) -> None:
    manifest = prepare_dataset(
        _options("fashion-mnist", tmp_path / "fm", limit=300, val_count=20)
    ).manifest
    assert (manifest.image_size, manifest.channels) == (32, 1)
    assert manifest.classes is not None and manifest.classes[0] == "T-shirt/top"
    assert {s: i.num_rows for s, i in manifest.splits.items()} == {
        "train": 280,
        "val": 20,
        "test": 300,
    }
    verify_shards(manifest)


def test_multiprocess_encoding_matches_serial(folder: Path, tmp_path: Path) -> None:
    serial = prepare_dataset(_options(folder, tmp_path / "s", image_size=4, val_count=2))
    prepare_dataset(_options(folder, tmp_path / "p", image_size=4, val_count=2, num_workers=2))
    a, b = _read_rows(tmp_path / "s"), _read_rows(tmp_path / "p")
    for split in serial.manifest.splits:
        np.testing.assert_array_equal(a[split]["pixels"], b[split]["pixels"])
        np.testing.assert_array_equal(a[split]["key"], b[split]["key"])


def test_shards_are_bounded_and_checksummed(tmp_path: Path) -> None:
    np.savez(tmp_path / "s.npz", _rng_images(100, 8, 3))
    out = tmp_path / "ds"
    manifest = prepare_dataset(
        _options(tmp_path / "s.npz", out, image_size=8, shard_max_rows=16)
    ).manifest
    shards = manifest.splits["train"].shards
    assert len(shards) == 7 and all(s.num_rows <= 16 for s in shards)
    assert sum(s.num_rows for s in shards) == 100
    verify_shards(manifest)
    corrupted = out / shards[3].path
    corrupted.write_bytes(corrupted.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(ValueError, match="checksum"):
        verify_shards(load_manifest(str(out)))


# ---------------------------------------------------------------------------------------------
# resize rule and channel conversion


def _reference_resize(image: Image.Image, resolution: int) -> np.ndarray:
    """improved-diffusion's ImageDataset.__getitem__ resize, verbatim in behaviour."""
    while min(*image.size) >= 2 * resolution:
        image = image.resize(tuple(x // 2 for x in image.size), resample=Image.BOX)
    scale = resolution / min(*image.size)
    image = image.resize(tuple(round(x * scale) for x in image.size), resample=Image.BICUBIC)
    arr = np.array(image.convert("RGB"))
    crop_y = (arr.shape[0] - resolution) // 2
    crop_x = (arr.shape[1] - resolution) // 2
    return arr[crop_y : crop_y + resolution, crop_x : crop_x + resolution]


@pytest.mark.parametrize("size", [(100, 60), (60, 100), (28, 28), (37, 90), (256, 256)])
def test_resize_matches_improved_diffusion(size: tuple[int, int]) -> None:
    array = np.random.default_rng(5).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    image = Image.fromarray(array)
    ours = np.asarray(resize_center_crop(image, image_size=32))
    assert ours.shape == (32, 32, 3)
    np.testing.assert_array_equal(ours, _reference_resize(image, 32))


def test_channel_conversions() -> None:
    rgba = Image.new("RGBA", (4, 4), (10, 20, 30, 0))  # fully transparent
    assert np.asarray(to_channels(rgba, channels=3)).tolist() == [[[255, 255, 255]] * 4] * 4
    opaque = Image.new("RGBA", (2, 2), (10, 20, 30, 255))
    assert np.asarray(to_channels(opaque, channels=3))[0, 0].tolist() == [10, 20, 30]
    grey = Image.new("L", (2, 2), 77)
    assert np.asarray(to_channels(grey, channels=3))[0, 0].tolist() == [77, 77, 77]
    assert to_channels(Image.new("RGB", (2, 2), (255, 0, 0)), channels=1).mode == "L"
    palette = Image.new("P", (2, 2), 1)
    palette.putpalette([0, 0, 0, 200, 100, 50] + [0] * 762)
    assert np.asarray(to_channels(palette, channels=3))[0, 0].tolist() == [200, 100, 50]
    palette.info["transparency"] = 1
    assert np.asarray(to_channels(palette, channels=3))[0, 0].tolist() == [255, 255, 255]
    la = Image.new("LA", (2, 2), (0, 0))
    assert np.asarray(to_channels(la, channels=1))[0, 0] == 255
    deep = Image.fromarray(np.full((2, 2), 65535, dtype=np.uint16))
    assert np.asarray(to_channels(deep, channels=1))[0, 0] == 255


# ---------------------------------------------------------------------------------------------
# bad input and all-or-nothing output


def _folder_with_bad_files(root: Path, *, good: int) -> list[str]:
    root.mkdir(parents=True)
    for i in range(good):
        Image.fromarray(_rng_images(1, 8, 3, seed=i)[0]).save(root / f"ok_{i:03d}.png")
    (root / "empty.png").write_bytes(b"")
    buffer = io.BytesIO()
    Image.fromarray(_rng_images(1, 64, 3)[0]).save(buffer, format="PNG")
    (root / "truncated.png").write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    (root / "garbage.jpg").write_bytes(b"this is not a jpeg at all")
    return ["empty.png", "garbage.jpg", "truncated.png"]


def test_bad_images_are_skipped_counted_and_listed(tmp_path: Path) -> None:
    bad = _folder_with_bad_files(tmp_path / "src", good=20)
    out = tmp_path / "ds"
    summary = prepare_dataset(_options(tmp_path / "src", out, image_size=8, max_bad_fraction=0.2))
    manifest = load_manifest(str(out))
    assert manifest.num_images == 20 and manifest.num_bad == 3
    assert sorted(b.key for b in manifest.bad_examples) == bad
    reasons = {b.key: b.reason for b in manifest.bad_examples}
    assert "empty" in reasons["empty.png"] and "truncated" in reasons["truncated.png"]
    text = summary.format()
    assert "skipped (unreadable): 3" in text and "truncated.png" in text


def test_too_many_bad_images_fail_and_leave_nothing(tmp_path: Path) -> None:
    _folder_with_bad_files(tmp_path / "src", good=20)
    out = tmp_path / "ds"
    with pytest.raises(BadInputError, match=r"more than 1\.0% of 23 images are unreadable"):
        prepare_dataset(_options(tmp_path / "src", out, image_size=8))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_nothing_readable_fails(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.png").write_bytes(b"")
    with pytest.raises(BadInputError):
        prepare_dataset(_options(source, tmp_path / "ds", image_size=8, max_bad_fraction=1.0))
    assert not (tmp_path / "ds").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no image files"):
        prepare_dataset(_options(empty, tmp_path / "ds", image_size=8))


def test_failure_mid_write_leaves_no_output(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from raydiff.data import shards

    calls = {"n": 0}
    original = shards.ShardWriter.flush

    def failing_flush(self: shards.ShardWriter) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full (injected)")
        original(self)

    monkeypatch.setattr(shards.ShardWriter, "flush", failing_flush)
    with pytest.raises(OSError, match="injected"):
        prepare_dataset(_options(folder, tmp_path / "ds", image_size=8, shard_max_rows=2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGTERM"])
def test_killed_prepare_leaves_no_dataset(tmp_path: Path, signal_name: str) -> None:
    import signal
    import time

    np.savez(tmp_path / "big.npz", _rng_images(10000, 32, 3))
    out = tmp_path / "ds"
    process = subprocess.Popen(
        [sys.executable, str(REPO / "jobs" / "prepare.py"), str(tmp_path / "big.npz"),
         "--out", str(out), "--workers", "1", "--shard-rows", "256", "--quiet"],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not list(tmp_path.glob(".ds.tmp-*/train/*.parquet")):
        assert process.poll() is None and time.monotonic() < deadline, "prepare never started"
        time.sleep(0.05)
    process.send_signal(getattr(signal, signal_name))
    # SIGTERM stops it as Ctrl-C does (raydiff.cli.app), with the shells' code for SIGTERM.
    assert process.wait(timeout=30) == (143 if signal_name == "SIGTERM" else -signal.SIGKILL)
    assert not out.exists()
    leftovers = list(tmp_path.glob(".ds.tmp-*"))
    if signal_name == "SIGTERM":
        assert leftovers == []  # cleaned up on the way out
    else:
        # SIGKILL cannot be caught: a hidden temp folder, never a manifest, and the next run
        # removes it.
        assert len(leftovers) == 1 and not list(leftovers[0].rglob("manifest.json"))
        np.savez(tmp_path / "small.npz", _rng_images(10, 8, 3))
        prepare_dataset(_options(tmp_path / "small.npz", out, image_size=8))
        assert not list(tmp_path.glob(".ds.tmp-*"))
        assert load_manifest(str(out)).num_images == 10


def test_rerun_is_refused_unless_overwrite(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ds"
    args = ["prepare", str(folder), "--out", str(out), "--image-size", "8", "--workers", "1"]
    assert main([*args, "--quiet"]) == 0
    before = json.loads((out / "manifest.json").read_text())
    assert main([*args, "--quiet"]) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert main([*args, "--overwrite", "--image-size", "4"]) == 0
    assert "prepared 12 images (4x4x3" in capsys.readouterr().out
    after = json.loads((out / "manifest.json").read_text())
    assert (before["image_size"], after["image_size"]) == (8, 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "images"]


def test_overwrite_replaces_datasets_only(tmp_path: Path) -> None:
    """--overwrite never deletes a folder that is not a prepared dataset, nor the source."""
    np.savez(tmp_path / "src.npz", _rng_images(10, 8, 3))
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "my_notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match=r"no manifest\.json"):
        prepare_dataset(_options(tmp_path / "src.npz", notes, image_size=8, overwrite=True))
    assert (notes / "my_notes.txt").read_text() == "keep me"
    out = tmp_path / "ds"
    prepare_dataset(_options(tmp_path / "src.npz", out, image_size=8))
    np.savez(out / "inside.npz", _rng_images(10, 8, 3))
    with pytest.raises(ValueError, match="contains the source"):
        prepare_dataset(_options(out / "inside.npz", out, image_size=8, overwrite=True))
    assert (out / "inside.npz").is_file() and (out / "manifest.json").is_file()


def test_a_temporary_with_our_own_pid_is_stale(tmp_path: Path) -> None:
    """In a container a rerun may get the PID of the prepare that was killed (PID 1)."""
    import os

    np.savez(tmp_path / "src.npz", _rng_images(10, 8, 3))
    stale = tmp_path / f".ds.tmp-{os.getpid()}"
    (stale / "train").mkdir(parents=True)
    prepare_dataset(_options(tmp_path / "src.npz", tmp_path / "ds", image_size=8))
    assert not stale.exists()
    assert load_manifest(str(tmp_path / "ds")).num_images == 10


def test_cli_reports_user_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prepare", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "does not exist" in err and "fashion-mnist" in err


# ---------------------------------------------------------------------------------------------
# config, compatibility, seeds


def test_data_config_validation() -> None:
    assert DataConfig().random_flip is True
    for field, value, match in [
        ("channels", 2, r"data.channels=2 is invalid: valid values: \(1, 3\)"),
        ("image_size", 0, "data.image_size=0"),
        ("shuffle_buffer_size", -1, "data.shuffle_buffer_size=-1"),
        ("data_dir", "", "data.data_dir"),
        ("random_flip", "yes", "data.random_flip='yes'"),
        ("seed", True, "data.seed=True"),
    ]:
        with pytest.raises(ValueError, match=match):
            DataConfig(**{field: value})


def test_check_compatible_names_the_field(folder: Path, tmp_path: Path) -> None:
    manifest = prepare_dataset(_options(folder, tmp_path / "ds", image_size=8)).manifest
    check_compatible(manifest, image_size=8, channels=3)
    with pytest.raises(ValueError, match="image_size mismatch: the model expects 32"):
        check_compatible(manifest, image_size=32, channels=3)
    with pytest.raises(ValueError, match="channels mismatch"):
        check_compatible(manifest, image_size=8, channels=1)
    with pytest.raises(ValueError, match=r"class_cond=True but .* has no labels"):
        check_compatible(manifest, image_size=8, channels=3, class_cond=True)
    with pytest.raises(FileNotFoundError, match="raydiff prepare"):
        load_manifest(str(tmp_path / "nowhere"))


def test_flip_mask_is_seeded_per_epoch_and_balanced() -> None:
    index = np.arange(10000)
    a = flip_mask(index, seed=0, epoch=0)
    np.testing.assert_array_equal(a, flip_mask(index, seed=0, epoch=0))
    assert 0.47 < a.mean() < 0.53
    assert (a != flip_mask(index, seed=0, epoch=1)).mean() > 0.4
    assert (a != flip_mask(index, seed=1, epoch=0)).mean() > 0.4


def test_data_package_imports_without_ray_or_torch() -> None:
    code = (
        "import sys, raydiff.data, raydiff.data.prepare, raydiff.data.pipeline, raydiff.cli; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('ray', 'torch')]; "
        "assert not bad, bad[:5]"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_a_corrupt_manifest_is_named(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text('{"format_version": 1}')
    with pytest.raises(ValueError, match=r"manifest\.json in .* is not a valid raydiff manifest"):
        load_manifest(str(tmp_path))
    (tmp_path / "manifest.json").write_text("{truncated")
    with pytest.raises(ValueError, match="--overwrite"):
        load_manifest(str(tmp_path))


@pytest.mark.skipif(not Path("/proc").is_mount(), reason="needs a mount point to point at")
def test_a_mount_point_is_refused_before_encoding(tmp_path: Path) -> None:
    np.savez(tmp_path / "src.npz", _rng_images(4, 8, 3))
    with pytest.raises(ValueError, match="is a mount point: give a folder inside it"):
        prepare_dataset(_options(tmp_path / "src.npz", Path("/proc"), image_size=8))


def test_folder_listing_survives_symlink_loops(folder: Path) -> None:
    from raydiff.data.sources import list_image_files

    before = list_image_files(folder)
    (folder / "loop").symlink_to(folder, target_is_directory=True)  # a link back up the tree
    (folder / "self").symlink_to(folder / "self")  # a link to itself
    assert list_image_files(folder) == before


def test_a_val_split_that_leaves_no_training_image_is_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "src.npz", _rng_images(10, 8, 3))
    with pytest.raises(ValueError, match="leaves none to train on"):
        prepare_dataset(_options(tmp_path / "src.npz", tmp_path / "ds", val_fraction=0.99))


def test_prepare_option_errors_name_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "ds")
    assert main(["prepare", "fashion-mnist", "--out", out, "--workers", "0"]) == 1
    assert "--workers 0 is invalid" in capsys.readouterr().err
    assert main(["prepare", "fashion-mnist", "--out", out, "--shard-rows", "0"]) == 1
    assert "--shard-rows 0 is invalid" in capsys.readouterr().err


def test_prepare_option_errors_are_config_errors_naming_the_option() -> None:
    from raydiff.errors import ConfigError, UserInputError

    with pytest.raises(ConfigError) as info:
        PrepareOptions(source="fashion-mnist", out="ds", num_workers=0)
    assert (info.value.section, info.value.field, info.value.value) == ("prepare", "num_workers", 0)
    assert str(info.value) == "prepare.num_workers=0 is invalid: valid: integers >= 1"
    assert issubclass(BadInputError, UserInputError)


def test_a_stored_png_decodes_to_its_pixels_and_a_wrong_size_is_named() -> None:
    from raydiff.data.encode import ImageSpec, decode_png, encode_array

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
    png, reason = encode_array(pixels, spec=ImageSpec(image_size=8, channels=3))
    assert reason is None
    np.testing.assert_array_equal(decode_png(png, image_size=8, channels=3), pixels)
    with pytest.raises(UserInputError, match=r"row 'a/1.png' is a 8x8x3 image, .* says 4x4x3"):
        decode_png(png, image_size=4, channels=3, key="a/1.png")
    with pytest.raises(UserInputError, match="says 8x8x1"):
        decode_png(png, image_size=8, channels=1)


def test_a_split_the_dataset_lacks_is_named_with_the_ones_it_has(tiny_prepared) -> None:
    manifest = load_manifest(str(tiny_prepared))
    assert manifest.check_split("train") is manifest.splits["train"]
    splits = ", ".join(manifest.splits)
    with pytest.raises(UserInputError, match=f"has no split 'test'; its splits: {splits}$"):
        manifest.check_split("test")
    with pytest.raises(UserInputError, match=r"^data\.train_split 'test': the dataset at "):
        manifest.check_split("test", setting="data.train_split")
    with pytest.raises(UserInputError, match="has no split 'test'"):
        manifest.shard_uris("test")


# ---------------------------------------------------------------------------------------------
# a URI destination (a RemotePath on pyarrow's local filesystem: the same upload code as S3)


def _to_remote(folder: Path, root: Path, **overrides: object) -> PrepareOptions:
    import dataclasses

    import pyarrow.fs

    from raydiff.storage import RemotePath

    target = RemotePath(pyarrow.fs.LocalFileSystem(), str(root), f"s3://bucket/{root.name}")
    return dataclasses.replace(_options(folder, root, **overrides), out=target)  # type: ignore[arg-type]


def test_a_uri_destination_gets_the_same_shards_manifest_last(folder: Path, tmp_path: Path) -> None:
    local, remote_root = tmp_path / "local", tmp_path / "remote"
    prepare_dataset(_options(folder, local))
    summary = prepare_dataset(_to_remote(folder, remote_root))
    assert summary.out == "s3://bucket/remote"
    for split, rows in _read_rows(local).items():
        uploaded = _read_rows(remote_root)[split]
        assert np.array_equal(rows["pixels"], uploaded["pixels"])
        assert list(rows["key"]) == list(uploaded["key"])
    for shard in load_manifest(str(remote_root)).splits["train"].shards:
        assert (remote_root / shard.path).read_bytes() == (local / shard.path).read_bytes()


def test_a_uri_destination_is_refused_unless_overwrite_or_foreign(
    folder: Path, tmp_path: Path
) -> None:
    root = tmp_path / "remote"
    prepare_dataset(_to_remote(folder, root))
    with pytest.raises(FileExistsError, match="pass --overwrite"):
        prepare_dataset(_to_remote(folder, root))
    prepare_dataset(_to_remote(folder, root, overwrite=True))
    (root / "notes.txt").write_text("not ours")
    with pytest.raises(FileExistsError, match=r"'notes\.txt'"):
        prepare_dataset(_to_remote(folder, root, overwrite=True))
