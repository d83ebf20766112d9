"""Image sources as uint8 arrays: samples, image folders and prepared datasets (what the
evaluations measure and an upsampler takes as its low-resolution input).

Sources are improved-diffusion's sample ``.npz`` (``arr_0`` uint8 ``[N, H, W, C]``), a folder of
PNG/JPEG files, or a raydiff prepared dataset (a folder or URI with ``manifest.json``). Every
source gives uint8 ``[N, H, W, C]`` (C = 1 or 3) in a fixed order, which is what
:func:`raydiff.evaluate.inception.extract_features` takes. No Ray here.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
from PIL import Image

from raydiff.data.in_memory import read_split_pixels
from raydiff.data.manifest import MANIFEST_NAME, is_dataset, load_manifest
from raydiff.errors import UserInputError
from raydiff.storage import local_path

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg"})
SOURCE_KINDS = "an .npz of samples (arr_0), a folder of PNG/JPEG images or a prepared dataset"


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
    if is_dataset(source):
        # Decoded from the PNGs straight to uint8 (no float round trip).
        return read_split_pixels(load_manifest(str(source)), split, limit=limit)[0]
    path = local_path(source)
    assert path is not None  # a URI is a dataset
    if not path.exists():
        raise UserInputError(f"{path} does not exist; expected {SOURCE_KINDS}")
    if path.is_dir():
        return _folder_images(path, limit=limit)
    if path.suffix.lower() == ".npz":
        return _npz_images(path, limit=limit)
    raise UserInputError(f"{path} is not an .npz file or a folder; expected {SOURCE_KINDS}")


def load_labelled_images(
    source: str | Path, *, split: str = "test", limit: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Images of ``source`` (as :func:`load_images`) and their int64 class labels: a sample
    ``.npz``'s ``arr_1`` (``raydiff sample`` writes the classes of class-conditional and guided
    samples there), or a prepared dataset's labels. Sources without labels are refused."""
    if is_dataset(source):
        images, labels = read_split_pixels(load_manifest(str(source)), split, limit=limit)
        if (labels < 0).any():
            raise UserInputError(f"{source}: split {split!r} has no labels")
        return images, labels.astype(np.int64)
    images = load_images(source, split=split, limit=limit)
    path = local_path(source)
    assert path is not None  # a URI is a dataset
    if path.suffix.lower() != ".npz":
        raise UserInputError(
            f"{source} has no labels: give a sample .npz with arr_1 (the samples of a "
            "class-conditional or classifier-guided model) or a prepared dataset with labels"
        )
    with np.load(path, allow_pickle=False) as archive:
        if "arr_1" not in archive.files:
            raise UserInputError(
                f"{path} has no arr_1 (labels): its samples are unconditional and unguided"
            )
        labels = archive["arr_1"][:limit]
    if labels.shape != (len(images),) or not np.issubdtype(labels.dtype, np.integer):
        raise UserInputError(
            f"{path}: arr_1 is {labels.dtype} {list(labels.shape)}; expected one integer label "
            f"per image of arr_0 ({len(images)})"
        )
    return images, labels.astype(np.int64)


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
