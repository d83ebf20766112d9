"""Where samples go: improved-diffusion's npz, one PNG per sample, and a grid. No Ray here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from raydiff.storage import MirroredFolder, StoragePath
from raydiff.train.sample_grid import save_png, tile

SAMPLING_RECORD = "sampling.json"
"""In a ``raydiff sample --out`` folder: the options it ran with (the checkpoint resolved), so
``raydiff evaluate fid`` knows the samples' model, dataset and run."""


def npz_name(samples: np.ndarray) -> str:
    """improved-diffusion's file name for ``[N, H, W, C]`` samples: ``samples_NxHxWxC.npz``."""
    return "samples_" + "x".join(str(d) for d in samples.shape) + ".npz"


def is_npz_name(name: str) -> bool:
    """Whether a file name is one :func:`npz_name` gives."""
    return name.startswith("samples_") and name.endswith(".npz")


def write_npz(samples: np.ndarray, out_dir: Path, *, labels: np.ndarray | None = None) -> Path:
    """``arr_0``: uint8 ``[N, H, W, C]``; ``arr_1``: int64 labels for a class-conditional model
    (as improved-diffusion's ``image_sample.py`` writes them). Written atomically."""
    if samples.dtype != np.uint8 or samples.ndim != 4:
        raise ValueError(f"samples must be uint8 [N, H, W, C], got {samples.dtype} {samples.shape}")
    if labels is not None and len(labels) != len(samples):
        raise ValueError(f"{len(labels)} labels for {len(samples)} samples")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / npz_name(samples)
    tmp = path.with_name(path.stem + ".tmp.npz")
    arrays = [samples] if labels is None else [samples, labels.astype(np.int64)]
    np.savez(tmp, *arrays)
    tmp.replace(path)
    return path


def write_grid(samples: np.ndarray, path: Path, *, max_images: int = 256) -> Path:
    """A grid PNG of the first ``max_images`` samples."""
    return save_png(tile(samples[:max_images]), path)


def write_sampling_outputs(
    samples: np.ndarray,
    out: StoragePath,
    *,
    labels: np.ndarray | None,
    record: dict[str, Any],
) -> StoragePath:
    """A ``raydiff sample --out`` folder: the npz (``labels`` as ``arr_1``), one PNG per sample
    in ``images/``, ``grid.png`` and the record of where the samples came from
    (:data:`SAMPLING_RECORD`), written locally (in place, or staged and uploaded for a URI).
    Returns the npz's path (or URI)."""
    folder = MirroredFolder(out)
    try:
        npz = write_npz(samples, folder.local, labels=labels)
        for k, image in enumerate(samples):
            save_png(image, folder.local / "images" / f"sample_{k:06d}.png")
        write_grid(samples, folder.local / "grid.png")
        (folder.local / SAMPLING_RECORD).write_text(json.dumps(record, indent=2))
        # The record last: a folder holding it holds every sample.
        for name in (npz.name, "images", "grid.png", SAMPLING_RECORD):
            folder.publish(name)
    finally:
        folder.close()
    return out / npz.name
