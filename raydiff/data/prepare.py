"""``raydiff prepare``: any image source -> Parquet shards of PNG bytes + ``manifest.json``.

The output appears all at once or not at all: everything is written into a hidden temporary
folder next to the destination, the manifest last, and the folder is renamed into place only
after every check has passed. A killed run leaves at most a ``.NAME.tmp-PID`` folder (removed by
the next run once that process is gone), never a folder with a manifest.

A URI destination (``s3://bucket/prefix``) has no rename: the dataset is built in a local
temporary folder and uploaded file by file, the manifest last, after any old manifest there was
deleted. A reader trusts only a folder with a manifest, so a killed upload leaves shards that no
reader uses (and that the next prepare to that place replaces).
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import contextlib
import dataclasses
import functools
import logging
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import numpy as np

from raydiff import __version__
from raydiff.data.encode import FITS, EncodeResult, Fit, ImageSpec, encode_chunk
from raydiff.data.manifest import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    BadImage,
    Manifest,
    SplitInfo,
)
from raydiff.data.shards import NO_LABEL, ShardWriter
from raydiff.data.sources import (
    EMBEDDED_SOURCES,
    LABEL_RULES,
    LabelRule,
    Source,
    SplitItems,
    open_source,
)
from raydiff.errors import ConfigError, UserInputError
from raydiff.flags import flag
from raydiff.storage import (
    StoragePath,
    check_writable,
    local_path,
    resolve_location,
    upload,
    write_text_atomically,
)

logger = logging.getLogger(__name__)

# Default image size of a named source (Fashion-MNIST: the demo's 32x32); anything else gets
# improved-diffusion's default of 64.
EMBEDDED_IMAGE_SIZE = {"fashion-mnist": 32}
DEFAULT_IMAGE_SIZE = 64
NUM_BAD_EXAMPLES = 20
_CHUNK_IMAGES = 256


@dataclass(kw_only=True)
class PrepareOptions:
    """Everything ``prepare_dataset`` needs; each field with a flag is an option of ``raydiff
    prepare`` (its help says what the field means)."""

    section: ClassVar[str] = "prepare"
    """What a ``ConfigError`` of these options names as its section."""

    source: str = flag(
        "SOURCE",
        help="image folder (recursive; jpg jpeg png gif webp bmp), IDX images file or folder, "
        f".npz (arr_0 NHWC uint8, optional arr_1 labels), or one of: {', '.join(EMBEDDED_SOURCES)}",
    )
    out: str = flag("--out", help="folder to create: a local path or a URI (s3://bucket/prefix)")
    image_size: int | None = flag(
        "--image-size",
        default=None,
        help="side of the stored square images (default: 32 for fashion-mnist, else 64)",
    )
    channels: int | None = flag(
        "--channels",
        default=None,
        choices=(1, 3),
        help="1 (grey) or 3 (RGB); default: 1 for grey IDX/.npz sources, else 3",
    )
    fit: Fit = flag(
        "--fit",
        default="resize",
        help="resize: improved-diffusion's rule (BOX halving, BICUBIC, centre crop); "
        "pad: centre-pad smaller images with black (default: %(default)s)",
    )
    labels: LabelRule = flag(
        "--labels",
        default="auto",
        help="prefix: file name before the first '_' (improved-diffusion); folder: first "
        "sub-folder; auto: stored labels of IDX/.npz, none for folders (default: %(default)s)",
    )
    val_count: int = flag(
        "--val-count",
        default=1000,
        help="images held out of train as the val split, at most 10%% of train "
        "(default: %(default)s; 0 for none)",
    )
    val_fraction: float | None = flag(
        "--val-fraction",
        default=None,
        help="fraction of train held out as val (overrides --val-count)",
    )
    seed: int = flag("--seed", default=0, help="seed of val and row order")
    max_bad_fraction: float = flag(
        "--max-bad-fraction",
        default=0.01,
        help="fail if more than this fraction of images is unreadable (default: %(default)s)",
    )
    overwrite: bool = flag(
        "--overwrite",
        default=False,
        help="replace an existing dataset (only after the new one is complete)",
    )
    num_workers: int = flag(
        "--workers",
        default_factory=lambda: os.cpu_count() or 1,
        help="encoder processes; 1 encodes in this process (default: the number of cores, "
        "%(default)s)",
    )
    shard_max_rows: int = flag(
        "--shard-rows", default=4096, help="rows per shard at most (default: %(default)s)"
    )
    shard_max_bytes: int = flag(
        "--shard-mb",
        default=64 << 20,
        type=float,
        from_arg=lambda mib: int(mib * (1 << 20)),
        arg_default=64.0,
        shown_as="--shard-mb (in bytes)",
        help="MiB of PNG data per shard at most (default: %(default)s)",
    )
    row_group_rows: int = 1024
    """Parquet row-group size inside a shard."""
    compress_level: int = flag(
        "--compress-level", default=1, help="PNG zlib level 0-9 (default: %(default)s, fast)"
    )
    limit: int | None = flag(
        "--limit", default=None, help="keep only the first N images of each split"
    )
    progress: bool = flag(
        "--quiet",
        default=True,
        action="store_true",
        from_arg=lambda quiet: not quiet,
        arg_default=False,
        help="no progress bar, no summary (the bar shows only when stderr is a terminal)",
    )

    def __post_init__(self) -> None:
        def fail(name: str, reason: str) -> ConfigError:
            return ConfigError(
                section="prepare", field=name, value=getattr(self, name), reason=reason
            )

        if not self.source:
            raise fail("source", "give an image folder, IDX, .npz or fashion-mnist")
        if not self.out:
            raise fail("out", "give the folder to create")
        if self.image_size is not None and self.image_size < 1:
            raise fail("image_size", "valid: integers >= 1")
        if self.channels not in (None, 1, 3):
            raise fail("channels", "valid values: 1, 3")
        if self.fit not in FITS:
            raise fail("fit", f"valid values: {', '.join(FITS)}")
        if self.labels not in LABEL_RULES:
            raise fail("labels", f"valid values: {', '.join(LABEL_RULES)}")
        if self.val_count < 0:
            raise fail("val_count", "valid: integers >= 0")
        if self.val_fraction is not None and not 0.0 <= self.val_fraction < 1.0:
            raise fail("val_fraction", "valid: 0 <= f < 1")
        if not 0.0 <= self.max_bad_fraction <= 1.0:
            raise fail("max_bad_fraction", "valid: 0 <= f <= 1")
        for name in ("num_workers", "shard_max_rows", "shard_max_bytes", "row_group_rows"):
            if getattr(self, name) < 1:
                raise fail(name, "valid: integers >= 1")
        if not 0 <= self.compress_level <= 9:
            raise fail("compress_level", "valid: 0-9")
        if self.limit is not None and self.limit < 1:
            raise fail("limit", "valid: integers >= 1 or None")


@dataclass(frozen=True)
class PrepareSummary:
    """What a finished prepare did."""

    out: str
    manifest: Manifest
    seconds: float

    def format(self, *, max_examples: int = 5) -> str:
        """A human-readable multi-line summary."""
        m = self.manifest
        rate = m.num_images / self.seconds if self.seconds > 0 else float("inf")
        lines = [
            f"prepared {m.num_images} images ({m.image_size}x{m.image_size}x{m.channels}, "
            f"fit={m.fit}) from {m.source['kind']} {m.source['location']} in "
            f"{self.seconds:.1f} s ({rate:.0f} img/s)",
            "splits: "
            + ", ".join(
                f"{name} {info.num_rows} rows in {len(info.shards)} shards"
                for name, info in m.splits.items()
            ),
            f"classes: {m.num_classes if m.classes else 'none (unlabelled)'}",
            f"skipped (unreadable): {m.num_bad}",
        ]
        lines += [f"  {bad.key}: {bad.reason}" for bad in m.bad_examples[:max_examples]]
        if m.num_bad > max_examples:
            lines.append(
                f"  ... {m.num_bad - max_examples} more (first {NUM_BAD_EXAMPLES} listed in the manifest)"
            )
        lines.append(f"written to {self.out}")
        return "\n".join(lines)


class BadInputError(UserInputError):
    """Too many unreadable images, or none readable at all."""


def prepare_dataset(options: PrepareOptions) -> PrepareSummary:
    """Run prepare; see the module docstring for the all-or-nothing guarantee."""
    started = time.perf_counter()
    target = resolve_location(options.out)
    out = local_path(target)
    if out is not None:
        _check_destination(out, overwrite=options.overwrite)
    else:
        check_writable(target, flag="--out")
        _check_remote_destination(target, overwrite=options.overwrite)
    source = open_source(options.source, labels=options.labels)
    location = str(source.location)
    local = local_path(location)
    if out is not None and local is not None and local.resolve().is_relative_to(out):
        raise UserInputError(
            f"--out {str(out)!r} contains the source {location!r}: replacing the folder would "
            "delete the images it is made from; choose another --out"
        )
    spec = ImageSpec(
        image_size=options.image_size
        or EMBEDDED_IMAGE_SIZE.get(options.source, DEFAULT_IMAGE_SIZE),
        channels=options.channels or _native_channels(source),
        fit=options.fit,
        compress_level=options.compress_level,
    )
    splits = _plan_splits(source, options=options)
    total = sum(len(items) for items in splits.values())
    logger.info(
        "preparing %d images from %s %s at %dx%dx%d with %d worker(s)",
        total, source.kind, source.location, spec.image_size, spec.image_size, spec.channels,
        options.num_workers,
    )  # fmt: skip
    write = functools.partial(
        _write_dataset, source=source, splits=splits, spec=spec, options=options, total=total
    )
    manifest = _build_in_place(out, write=write) if out else _build_and_upload(target, write=write)
    return PrepareSummary(
        out=str(target),
        manifest=dataclasses.replace(manifest, root=str(target)),
        seconds=time.perf_counter() - started,
    )


def _build_in_place(out: Path, *, write: Callable[[Path], Manifest]) -> Manifest:
    """``write`` the dataset into a hidden sibling folder, then rename it to ``out``."""
    _remove_stale_temporaries(out)
    # PID plus a random part: in a container a new prepare may get the PID of a killed one.
    temporary = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    temporary.mkdir(parents=True)
    try:
        manifest = write(temporary)
        _move_into_place(temporary, out)
    except BaseException:
        # BaseException: Ctrl-C and SystemExit (SIGTERM in the CLI) must clean up too.
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return manifest


def _build_and_upload(target: StoragePath, *, write: Callable[[Path], Manifest]) -> Manifest:
    """``write`` the dataset into a local temporary folder, then upload it, manifest last."""
    with tempfile.TemporaryDirectory(prefix="raydiff-prepare-") as staging:
        manifest = write(Path(staging))
        # The old manifest goes first: until the new one lands, no reader trusts the folder
        # while its shards are being replaced.
        (target / MANIFEST_NAME).unlink(missing_ok=True)
        upload(Path(staging), target, last=MANIFEST_NAME)
    return manifest


# What a prepared folder holds at its top: a URI destination with anything else is someone
# else's folder, which --overwrite must not write into.
_PREPARED_NAMES = frozenset({MANIFEST_NAME, "train", "val", "test"})


def _check_remote_destination(target: StoragePath, *, overwrite: bool) -> None:
    if not target.exists():
        return
    others = sorted(p.name for p in target.iterdir() if p.name not in _PREPARED_NAMES)
    if others:
        raise FileExistsError(
            f"--out {target} holds {others[0]!r}, which a prepared dataset does not: choose "
            "an empty or new place"
        )
    if (target / MANIFEST_NAME).is_file() and not overwrite:
        raise FileExistsError(
            f"--out {target} already holds a prepared dataset; pass --overwrite to replace it"
        )


def _check_destination(out: Path, *, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {str(out)!r} exists and is not a folder")
    if os.path.ismount(out):
        # The dataset is built in a hidden sibling folder and renamed into place; a mount point
        # cannot be renamed (EBUSY), which would only show after all the encoding.
        raise UserInputError(
            f"--out {str(out)!r} is a mount point: give a folder inside it, e.g. "
            f"{str(out / 'dataset')!r}"
        )
    if out.is_dir() and any(out.iterdir()):
        if not (out / MANIFEST_NAME).exists():
            # --overwrite replaces a prepared dataset; it never deletes other people's files.
            raise FileExistsError(
                f"--out {str(out)!r} holds files but no {MANIFEST_NAME} (not a prepared "
                "dataset): choose an empty or new folder"
            )
        if not overwrite:
            raise FileExistsError(
                f"--out {str(out)!r} already holds a prepared dataset; pass --overwrite to "
                "replace it"
            )


def _native_channels(source: Source) -> int:
    for items in source.splits.values():
        if items.arrays is not None:
            return 1 if items.arrays.ndim == 3 or items.arrays.shape[3] == 1 else 3
    return 3


def _plan_splits(source: Source, *, options: PrepareOptions) -> dict[str, SplitItems]:
    """Apply --limit, hold val out of train, and fix a seeded row order for every split.

    Rows are written in a random (seeded) order so that every shard is a mix of all classes:
    Ray Data reshuffles blocks and a bounded buffer of rows, which cannot undo shards that each
    hold a single class (as a folder-per-class source listed in order would give).
    """
    rng = np.random.default_rng(options.seed)
    planned: dict[str, SplitItems] = {}
    for name, items in source.splits.items():
        if options.limit is not None and len(items) > options.limit:
            items = items.subset(np.arange(options.limit))
        planned[name] = items
    train = planned["train"]
    if options.val_fraction is not None:
        num_val = round(options.val_fraction * len(train))
    else:
        num_val = min(options.val_count, len(train) // 10)
    if num_val >= len(train):
        raise UserInputError(
            f"holding out {num_val} of the {len(train)} training images as val leaves none to "
            "train on: lower --val-fraction / --val-count"
        )
    order = rng.permutation(len(train))
    result = {"train": train.subset(order[num_val:])}
    if num_val:
        result["val"] = train.subset(np.sort(order[:num_val]))
    for name, items in planned.items():
        if name != "train":
            result[name] = items
    return {
        name: items if name == "train" else items.subset(rng.permutation(len(items)))
        for name, items in result.items()
    }


def _chunks(
    items: SplitItems, spec: ImageSpec
) -> Iterator[tuple[list[str] | np.ndarray, ImageSpec]]:
    for start in range(0, len(items), _CHUNK_IMAGES):
        stop = start + _CHUNK_IMAGES
        payload = items.arrays[start:stop] if items.arrays is not None else items.paths[start:stop]
        yield payload, spec


def _write_dataset(
    root: Path,
    *,
    source: Source,
    splits: dict[str, SplitItems],
    spec: ImageSpec,
    options: PrepareOptions,
    total: int,
) -> Manifest:
    """Encode every split into shards under ``root``, then write the manifest (last)."""
    from tqdm import tqdm

    bad = _BadImages(total=total, options=options)
    split_infos: dict[str, SplitInfo] = {}
    bar = tqdm(
        total=total,
        unit="img",
        desc="prepare",
        disable=not (options.progress and sys.stderr.isatty()),
    )
    try:
        with _encoder(num_workers=options.num_workers) as encode:
            for name, items in splits.items():
                split_infos[name] = _write_split(
                    root,
                    name=name,
                    items=items,
                    encoded=encode(_chunks(items, spec)),
                    classes=source.classes,
                    options=options,
                    bad=bad,
                    progress=bar.update,
                )
    finally:
        bar.close()
    manifest = _build_manifest(
        root, source=source, spec=spec, options=options, split_infos=split_infos, bad=bad
    )
    # Written last and atomically: a folder with a manifest is a complete dataset.
    write_text_atomically(root / MANIFEST_NAME, manifest.to_json())
    return manifest


@dataclass
class _BadImages:
    """The images prepare skipped so far, and the budget (``--max-bad-fraction``) they may use.

    Failing as soon as the count passes the budget avoids encoding a doomed dataset.
    """

    total: int
    options: PrepareOptions
    count: int = 0
    examples: list[BadImage] = field(default_factory=list)

    def record(self, *, key: str, reason: str | None) -> None:
        """Count one bad image; raises ``BadInputError`` once the budget is passed."""
        self.count += 1
        if len(self.examples) < NUM_BAD_EXAMPLES:
            self.examples.append(BadImage(key=key, reason=reason or "unknown"))
        if self.count > int(self.options.max_bad_fraction * self.total):
            examples = "; ".join(f"{b.key}: {b.reason}" for b in self.examples[:5])
            raise BadInputError(
                f"more than {self.options.max_bad_fraction:.1%} of {self.total} images are "
                f"unreadable ({self.count} so far, e.g. {examples}); nothing written. Fix or "
                "remove them, or raise --max-bad-fraction"
            )


@contextlib.contextmanager
def _encoder(*, num_workers: int) -> Iterator[Callable[..., Iterator[list[EncodeResult]]]]:
    """``map(encode_chunk, ...)`` in this process, or over ``num_workers`` worker processes."""
    if num_workers <= 1:
        yield functools.partial(map, encode_chunk)
        return
    # spawn, not fork: the caller may hold threads (Ray, torch, tqdm) that fork would copy.
    # An executor, not multiprocessing.Pool: when a worker dies (the OOM killer) Pool.imap
    # waits forever, the executor raises BrokenProcessPool.
    pool = concurrent.futures.ProcessPoolExecutor(
        num_workers, mp_context=multiprocessing.get_context("spawn")
    )
    try:
        yield functools.partial(pool.map, encode_chunk)
    except concurrent.futures.process.BrokenProcessPool:
        raise RuntimeError(
            "an image-encoding worker process died (killed, or out of memory: try fewer "
            "--workers); nothing written. Called from a script? Worker processes are spawned and "
            "import the script again: guard the call with `if __name__ == '__main__':`"
        ) from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _write_split(
    root: Path,
    *,
    name: str,
    items: SplitItems,
    encoded: Iterator[list[EncodeResult]],
    classes: list[str] | None,
    options: PrepareOptions,
    bad: _BadImages,
    progress: Callable[[int], object],
) -> SplitInfo:
    """Write one split's ``encoded`` images (chunks in the order of ``items``) as shards."""
    writer = ShardWriter(
        root=root,
        split=name,
        max_rows=options.shard_max_rows,
        max_bytes=options.shard_max_bytes,
        row_group_rows=options.row_group_rows,
    )
    counts: Counter[int] = Counter()
    position = 0
    for chunk in encoded:
        for png, reason in chunk:
            key = items.keys[position]
            label = NO_LABEL if items.labels is None else int(items.labels[position])
            position += 1
            if png is None:
                bad.record(key=key, reason=reason)
                continue
            writer.add(key=key, label=label, png=png)
            counts[label] += 1
        progress(len(chunk))
    writer.flush()
    class_counts = None
    if classes is not None:
        class_counts = {classes[i]: counts[i] for i in sorted(counts)}
    return SplitInfo(num_rows=writer.num_rows, shards=writer.shards, class_counts=class_counts)


def _build_manifest(
    root: Path,
    *,
    source: Source,
    spec: ImageSpec,
    options: PrepareOptions,
    split_infos: dict[str, SplitInfo],
    bad: _BadImages,
) -> Manifest:
    """The manifest of the written splits; refuses a dataset or a split left with no image."""
    num_images = sum(info.num_rows for info in split_infos.values())
    if num_images == 0:
        raise BadInputError(
            f"no readable image in {source.location!r} ({bad.count} unreadable); nothing written"
        )
    for name, info in split_infos.items():
        if info.num_rows == 0:
            # A split emptied by bad images would break the pipeline later; say so now.
            raise BadInputError(f"split {name!r} has no readable image; nothing written")
    return Manifest(
        format_version=FORMAT_VERSION,
        raydiff_version=__version__,
        created_utc=datetime.now(UTC).isoformat(timespec="seconds"),
        source={"kind": source.kind, "location": source.location, "label_rule": source.label_rule},
        image_size=spec.image_size,
        channels=spec.channels,
        fit=spec.fit,
        num_images=num_images,
        classes=source.classes,
        splits=split_infos,
        num_bad=bad.count,
        bad_examples=bad.examples,
        options={
            "seed": options.seed,
            "val_count": options.val_count,
            "val_fraction": options.val_fraction,
            "max_bad_fraction": options.max_bad_fraction,
            "limit": options.limit,
            "compress_level": spec.compress_level,
            "shard_max_rows": options.shard_max_rows,
            "shard_max_bytes": options.shard_max_bytes,
        },
        root=str(root),
    )


def _move_into_place(temporary: Path, out: Path) -> None:
    """Rename the finished folder to ``out``; an old dataset there is removed only afterwards."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
    os.replace(temporary, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _remove_stale_temporaries(out: Path) -> None:
    """Delete ``.NAME.tmp-PID`` folders left by prepare runs that were killed."""
    if not out.parent.is_dir():
        return
    prefix = f".{out.name}.tmp-"
    for candidate in out.parent.iterdir():
        if not candidate.name.startswith(prefix):
            continue
        pid_text = candidate.name[len(prefix) :].split("-")[0]
        # Our own PID too: this prepare has not made its temporary yet, so one with our PID was
        # left by a killed prepare that had the same PID (containers reuse PID 1).
        if pid_text.isdigit() and (
            int(pid_text) == os.getpid() or not _process_alive(int(pid_text))
        ):
            logger.info("removing %s, left by a prepare that did not finish", candidate)
            shutil.rmtree(candidate, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
