"""``manifest.json``: what a prepared dataset holds, read locally or from object storage."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from raydiff.data.shards import ShardInfo, file_sha256
from raydiff.errors import UserInputError
from raydiff.storage import StoragePath, as_location, local_path, resolved

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class SplitInfo:
    """The shards of one split."""

    num_rows: int
    shards: list[ShardInfo]
    class_counts: dict[str, int] | None = None


@dataclass(frozen=True)
class BadImage:
    """One image that prepare skipped, and why."""

    key: str
    reason: str


@dataclass(frozen=True)
class Manifest:
    """A prepared dataset. ``root`` (not stored) is where it was loaded from."""

    format_version: int
    raydiff_version: str
    created_utc: str
    source: dict[str, str]
    image_size: int
    channels: int
    fit: str
    num_images: int
    classes: list[str] | None
    splits: dict[str, SplitInfo]
    num_bad: int
    bad_examples: list[BadImage]
    options: dict[str, Any] = field(default_factory=dict)
    root: str = field(default="", compare=False)

    @property
    def num_classes(self) -> int:
        """Number of classes (0 for an unlabelled dataset)."""
        return len(self.classes) if self.classes else 0

    def check_split(self, split: str, *, setting: str = "") -> SplitInfo:
        """The split named ``split``, or a ``UserInputError`` naming it and the splits the
        dataset has. ``setting``: where the name was given (``data.train_split``, ``--split``),
        to lead the message."""
        if split not in self.splits:
            lead = f"{setting} {split!r}: " if setting else ""
            raise UserInputError(
                f"{lead}the dataset at {self.root or '(unknown)'} has no split {split!r}; "
                f"its splits: {', '.join(self.splits) or '(none)'}"
            )
        return self.splits[split]

    def shard_uris(self, split: str) -> list[str]:
        """Absolute paths or URIs of the shards of ``split``."""
        base = self.root.rstrip("/")
        return [f"{base}/{shard.path}" for shard in self.check_split(split).shards]

    def to_json(self) -> str:
        """The manifest as stored (``root`` left out: a dataset can be moved or uploaded)."""
        data = asdict(self)
        data.pop("root")
        return json.dumps(data, indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, root: str = "") -> Manifest:
        """Parse a stored manifest; refuses format versions this raydiff does not know."""
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise UserInputError(
                f"manifest at {root!r} has format_version={version!r}; this raydiff reads "
                f"version {FORMAT_VERSION}: prepare the dataset again"
            )
        splits = {
            name: SplitInfo(
                num_rows=info["num_rows"],
                shards=[ShardInfo(**shard) for shard in info["shards"]],
                class_counts=info.get("class_counts"),
            )
            for name, info in data["splits"].items()
        }
        bad_examples = [BadImage(**bad) for bad in data["bad_examples"]]
        # "fit": a manifest from before --fit was resized.
        parsed = {"splits": splits, "bad_examples": bad_examples, "root": root}
        return cls(**{"fit": "resize", **data, **parsed})


def is_dataset(location: str | os.PathLike[str] | StoragePath) -> bool:
    """True where a prepared dataset is: a local folder with a manifest, or any URI (its manifest
    is read, and its absence reported, when it is used)."""
    local = local_path(location)
    return local is None or (local / MANIFEST_NAME).is_file()


def load_manifest(uri: str) -> Manifest:
    """Read ``manifest.json`` from a dataset folder given as a local path or a remote URI."""
    root = resolved(uri)
    hint = f"prepare one with `raydiff prepare SOURCE --out {uri}`"
    manifest_path = as_location(root) / MANIFEST_NAME  # S3 configured from the AWS environment
    if not manifest_path.is_file():
        raise FileNotFoundError(f"no {MANIFEST_NAME} in {root!r}: {hint}")
    text = manifest_path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise TypeError(f"expected a JSON object, got {type(data).__name__}")
        return Manifest.from_dict(data, root=root)
    except UserInputError:  # a format version this raydiff does not read: says so itself
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        detail = error if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
        raise UserInputError(
            f"{MANIFEST_NAME} in {root!r} is not a valid raydiff manifest ({detail}); prepare "
            f"the dataset again: `raydiff prepare SOURCE --out {uri} --overwrite`"
        ) from None


def check_compatible(
    manifest: Manifest,
    *,
    image_size: int,
    channels: int,
    class_cond: bool = False,
    num_classes: int | None = None,
) -> None:
    """Refuse a dataset that does not match the model, before any worker starts.

    Raises ``UserInputError`` naming the mismatched field, both values, and the way out.
    """
    where = manifest.root or "the dataset"
    if manifest.image_size != image_size:
        raise UserInputError(
            f"image_size mismatch: the model expects {image_size} but {where} holds "
            f"{manifest.image_size}x{manifest.image_size} images; set image_size="
            f"{manifest.image_size} or prepare again with --image-size {image_size}"
        )
    if manifest.channels != channels:
        raise UserInputError(
            f"channels mismatch: the model expects {channels} but {where} holds "
            f"{manifest.channels}-channel images; prepare again with --channels {channels}"
        )
    if class_cond:
        if not manifest.classes:
            raise UserInputError(
                f"class_cond=True but {where} has no labels; prepare it with --labels "
                "prefix|folder (image folders) or use a labelled IDX/.npz source"
            )
        if num_classes is not None and manifest.num_classes > num_classes:
            raise UserInputError(
                f"num_classes mismatch: the model has {num_classes} classes but {where} has "
                f"{manifest.num_classes}: set num_classes={manifest.num_classes}"
            )


def verify_shards(manifest: Manifest) -> None:
    """Check every local shard's size and SHA-256 against the manifest (raises
    ``UserInputError``)."""
    root = local_path(manifest.root)
    if root is None:
        raise UserInputError("verify_shards reads local datasets only; download the dataset first")
    for split, info in manifest.splits.items():
        for shard in info.shards:
            path = root / shard.path
            if not path.is_file():
                raise UserInputError(f"shard {shard.path} of split {split!r} is missing")
            if path.stat().st_size != shard.num_bytes or file_sha256(path) != shard.sha256:
                raise UserInputError(f"shard {shard.path} of split {split!r} fails its checksum")
