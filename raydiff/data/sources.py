"""Image sources that ``raydiff prepare`` understands, listed into keys, labels and payloads.

A source is opened into one or more *splits* (``train`` and, where the source ships one, ``test``),
each a list of items: a key (where the image came from), an optional integer label, and either a
file path (decoded later, in a worker process) or a row of an in-memory uint8 array.
"""

from __future__ import annotations

import gzip
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from raydiff.errors import UserInputError

logger = logging.getLogger(__name__)

LabelRule = Literal["auto", "prefix", "folder", "none"]
LABEL_RULES: tuple[str, ...] = ("auto", "prefix", "folder", "none")
IMAGE_EXTENSIONS: tuple[str, ...] = ("jpg", "jpeg", "png", "gif", "webp", "bmp")

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES: tuple[str, ...] = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
# Named sources that need no path: name -> (directory of IDX files, class names).
EMBEDDED_SOURCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "fashion-mnist": (FASHION_MNIST_DIR, FASHION_MNIST_CLASSES),
}

_IDX_UINT8 = 0x08


@dataclass(frozen=True)
class SplitItems:
    """The images of one split: exactly one of ``paths`` and ``arrays`` is set."""

    keys: list[str]
    labels: np.ndarray | None  # int64 [N], or None when the source has no labels
    paths: list[str] | None = None
    arrays: np.ndarray | None = None  # uint8 [N, H, W] or [N, H, W, C]

    def __len__(self) -> int:
        return len(self.keys)

    def subset(self, index: np.ndarray) -> SplitItems:
        """The items at ``index`` (an int array), in that order."""
        return SplitItems(
            keys=[self.keys[i] for i in index],
            labels=None if self.labels is None else self.labels[index],
            paths=None if self.paths is None else [self.paths[i] for i in index],
            arrays=None if self.arrays is None else self.arrays[index],
        )


@dataclass(frozen=True)
class Source:
    """An opened source: its kind, where it is, its splits and its class names."""

    kind: Literal["folder", "idx", "npz"]
    location: str
    splits: dict[str, SplitItems]
    classes: list[str] | None
    label_rule: str


def open_source(source: str, *, labels: LabelRule = "auto") -> Source:
    """Open ``source``: an embedded name, an image folder, an IDX file or folder, or an ``.npz``.

    ``labels`` chooses the label rule: ``prefix`` (improved-diffusion: the file name before the
    first ``_``) or ``folder`` (the first sub-folder under the source) for image folders; the
    labels stored in the file for IDX and ``.npz`` sources; ``none`` for no labels. ``auto`` is
    the stored labels for IDX/``.npz`` and no labels for image folders (``PrepareOptions``
    refuses any other rule).
    """
    if source in EMBEDDED_SOURCES:
        directory, class_names = EMBEDDED_SOURCES[source]
        if not os.path.isdir(directory):
            raise FileNotFoundError(
                f"the embedded dataset {source!r} needs {directory}; install it with "
                "`apt-get install dataset-fashion-mnist`"
            )
        return _open_idx_dir(Path(directory), labels=labels, class_names=list(class_names))
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(
            f"source {source!r} does not exist; give an image folder, an IDX images file or "
            f"folder, an .npz file, or one of the embedded names: {', '.join(EMBEDDED_SOURCES)}"
        )
    if path.is_file():
        if path.name.endswith(".npz"):
            return _open_npz(path, labels=labels)
        if _is_idx_file(path):
            return _open_idx_files({"train": path}, labels=labels, class_names=None)
        raise UserInputError(
            f"source file {source!r} is neither an .npz nor an IDX file; image files are read "
            "from a folder"
        )
    if _idx_image_files(path):
        return _open_idx_dir(path, labels=labels, class_names=None)
    return _open_folder(path, labels=labels)


# ---------------------------------------------------------------------------------------------
# Image folders


def list_image_files(root: Path) -> list[Path]:
    """All image files under ``root``, recursively, in a stable (sorted) order.

    Symlinked folders are followed once each: a link back up the tree (a loop) is skipped.
    """
    found: list[Path] = []
    stack = [root]
    visited: set[tuple[int, int]] = set()
    while stack:
        directory = stack.pop()
        try:
            info = directory.stat()
        except OSError:  # a dangling link or a loop the OS refuses to resolve
            continue
        if (info.st_dev, info.st_ino) in visited:
            continue
        visited.add((info.st_dev, info.st_ino))
        with os.scandir(directory) as entries:
            for entry in entries:
                try:
                    is_dir = entry.is_dir(follow_symlinks=True)
                except OSError:  # ELOOP: a link to itself
                    continue
                if is_dir:
                    stack.append(Path(entry.path))
                elif "." in entry.name and entry.name.rsplit(".", 1)[1].lower() in IMAGE_EXTENSIONS:
                    found.append(Path(entry.path))
    return sorted(found)


def _open_folder(root: Path, *, labels: LabelRule) -> Source:
    files = list_image_files(root)
    if not files:
        raise UserInputError(
            f"no image files ({', '.join(IMAGE_EXTENSIONS)}) found under {str(root)!r}"
        )
    keys = [f.relative_to(root).as_posix() for f in files]
    rule = "none" if labels == "auto" else labels
    class_ids: np.ndarray | None = None
    classes: list[str] | None = None
    if rule in ("prefix", "folder"):
        if rule == "prefix":
            # improved-diffusion: "Assume classes are the first part of the filename, before an
            # underscore." A name without "_" is its own class, exactly as there.
            names = [f.name.split("_")[0] for f in files]
        else:
            at_root = [k for k in keys if "/" not in k]
            if at_root:
                raise UserInputError(
                    f"labels='folder' needs every image in a sub-folder of {str(root)!r}; "
                    f"{len(at_root)} are not, e.g. {at_root[:3]}"
                )
            names = [k.split("/", 1)[0] for k in keys]
        classes = sorted(set(names))
        index = {name: i for i, name in enumerate(classes)}
        class_ids = np.array([index[n] for n in names], dtype=np.int64)
    split = SplitItems(keys=keys, labels=class_ids, paths=[str(f) for f in files])
    return Source(
        kind="folder", location=str(root), splits={"train": split}, classes=classes, label_rule=rule
    )


# ---------------------------------------------------------------------------------------------
# IDX (MNIST format)


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (optionally gzipped) of unsigned bytes into an array of its shape."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise UserInputError(f"{str(path)!r} is not an IDX file (bad magic number)")
    dtype_code, num_dims = data[2], data[3]
    if dtype_code != _IDX_UINT8:
        raise UserInputError(
            f"{str(path)!r} holds IDX type 0x{dtype_code:02x}; only unsigned bytes (0x08) are "
            "supported"
        )
    shape = struct.unpack(f">{num_dims}I", data[4 : 4 + 4 * num_dims])
    offset = 4 + 4 * num_dims
    expected = int(np.prod(shape))
    if len(data) - offset != expected:
        raise UserInputError(
            f"{str(path)!r} is truncated or padded: header shape {shape} needs {expected} bytes, "
            f"found {len(data) - offset}"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(shape)


def _is_idx_file(path: Path) -> bool:
    return "idx" in path.name and "ubyte" in path.name


def _idx_image_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and "images-idx3" in p.name)


def _split_name(path: Path, *, only: bool) -> str:
    name = path.name.lower()
    if name.startswith("train") or only:
        return "train"
    if name.startswith(("t10k", "test")):
        return "test"
    raise UserInputError(
        f"cannot tell the split of IDX file {str(path)!r}: name it train-* or t10k-*/test-*"
    )


def _open_idx_dir(directory: Path, *, labels: LabelRule, class_names: list[str] | None) -> Source:
    files = _idx_image_files(directory)
    if not files:
        raise UserInputError(f"no *-images-idx3-ubyte[.gz] files in {str(directory)!r}")
    by_split: dict[str, Path] = {}
    for f in files:
        split = _split_name(f, only=len(files) == 1)
        if split in by_split:
            raise UserInputError(f"two IDX image files for split {split!r}: {by_split[split]}, {f}")
        by_split[split] = f
    return _open_idx_files(by_split, labels=labels, class_names=class_names, location=directory)


def _open_idx_files(
    images_by_split: dict[str, Path],
    *,
    labels: LabelRule,
    class_names: list[str] | None,
    location: Path | None = None,
) -> Source:
    if labels in ("prefix", "folder"):
        raise UserInputError(f"labels={labels!r} does not apply to IDX files; use auto|none")
    splits: dict[str, SplitItems] = {}
    max_label = -1
    has_labels = labels == "auto"
    for split, images_path in images_by_split.items():
        images = read_idx(images_path)
        if images.ndim != 3:
            raise UserInputError(
                f"{str(images_path)!r} has shape {images.shape}; expected [N, H, W]"
            )
        label_array: np.ndarray | None = None
        labels_path = images_path.with_name(images_path.name.replace("images-idx3", "labels-idx1"))
        if has_labels and labels_path.exists():
            label_array = read_idx(labels_path).astype(np.int64)
            if label_array.shape != (len(images),):
                raise UserInputError(
                    f"{str(labels_path)!r} holds {label_array.shape} labels for "
                    f"{len(images)} images"
                )
            max_label = max(max_label, int(label_array.max(initial=-1)))
        elif has_labels:
            logger.info("no labels file %s: the split %s is unlabelled", labels_path, split)
            has_labels = False
        keys = [f"{images_path.name}:{i}" for i in range(len(images))]
        splits[split] = SplitItems(keys=keys, labels=label_array, arrays=images)
    if not has_labels:
        splits = {
            s: SplitItems(keys=it.keys, labels=None, arrays=it.arrays) for s, it in splits.items()
        }
        classes = None
    else:
        classes = class_names or [str(i) for i in range(max_label + 1)]
        if len(classes) <= max_label:
            raise UserInputError(
                f"label {max_label} is outside the {len(classes)} known class names"
            )
    where = location or next(iter(images_by_split.values()))
    return Source(
        kind="idx",
        location=str(where),
        splits=splits,
        classes=classes,
        label_rule="file" if has_labels else "none",
    )


# ---------------------------------------------------------------------------------------------
# .npz (improved-diffusion's sample format)


def _open_npz(path: Path, *, labels: LabelRule) -> Source:
    if labels in ("prefix", "folder"):
        raise UserInputError(f"labels={labels!r} does not apply to .npz files; use auto|none")
    with np.load(path) as npz:
        if "arr_0" not in npz.files:
            raise UserInputError(f"{str(path)!r} has no arr_0 (arrays: {npz.files})")
        images = npz["arr_0"]
        label_array = npz["arr_1"] if "arr_1" in npz.files and labels == "auto" else None
    if images.dtype != np.uint8:
        raise UserInputError(f"{str(path)!r}: arr_0 has dtype {images.dtype}; expected uint8 NHWC")
    if images.ndim not in (3, 4) or (images.ndim == 4 and images.shape[3] not in (1, 3, 4)):
        raise UserInputError(
            f"{str(path)!r}: arr_0 has shape {images.shape}; expected [N, H, W] or [N, H, W, C] "
            "with C in 1, 3, 4"
        )
    classes: list[str] | None = None
    if label_array is not None:
        if label_array.shape != (len(images),) or not np.issubdtype(label_array.dtype, np.integer):
            raise UserInputError(
                f"{str(path)!r}: arr_1 must be {len(images)} integer labels, got "
                f"{label_array.dtype} {label_array.shape}"
            )
        label_array = label_array.astype(np.int64)
        if len(label_array) and label_array.min() < 0:
            raise UserInputError(f"{str(path)!r}: arr_1 has negative labels")
        classes = [str(i) for i in range(int(label_array.max(initial=-1)) + 1)]
    keys = [f"{path.name}:{i}" for i in range(len(images))]
    split = SplitItems(keys=keys, labels=label_array, arrays=images)
    return Source(
        kind="npz",
        location=str(path),
        splits={"train": split},
        classes=classes,
        label_rule="file" if classes is not None else "none",
    )
