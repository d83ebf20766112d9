"""``raydiff evaluate fid``: FID, KID, precision and recall of a set of samples, filed beside them
and in their run.

Samples written by ``raydiff sample`` know their checkpoint (its ``sampling.json``): the
reference defaults to the dataset that checkpoint's model trained on, and a run's checkpoint
gets the result in its TensorBoard. One Inception pass over each side in this process (no Ray).
``samples`` and ``out`` may be URIs: the samples are downloaded first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raydiff.errors import UserInputError
from raydiff.evaluate.fid import compute_fid
from raydiff.evaluate.report import RunCheckpoint, add_to_tensorboard, run_checkpoint, write_json
from raydiff.sample.outputs import SAMPLING_RECORD, is_npz_name
from raydiff.storage import RemotePath, local_copy, resolve_location

TENSORBOARD_SCALARS = {
    "fid": "fid",
    "kid": "kid_mean",
    "precision": "precision",
    "recall": "recall",
}
"""The run's ``eval/NAME_SPLIT`` scalars, by the result key each holds."""


@dataclass(kw_only=True)
class FidResult:
    """FID, KID, precision and recall and what they were computed between, and where they were
    written."""

    summary: dict[str, Any]
    json_path: Path | RemotePath
    tensorboard_run: Path | RemotePath | None


def run_fid(
    *,
    samples: str,
    reference: str | None,
    split: str = "test",
    inception: str | None = None,
    num_images: int | None = None,
    batch_size: int = 64,
    out: str | None = None,
) -> FidResult:
    """FID, KID, precision and recall of ``samples`` against ``reference`` (default: the
    samples' run's dataset), written to ``fid_SPLIT.json`` beside the samples (or ``out``)."""
    location, folder = _samples_location(samples)
    record_file = folder / SAMPLING_RECORD
    record = json.loads(record_file.read_text()) if record_file.is_file() else {}
    run = run_checkpoint(record["checkpoint"]) if record.get("checkpoint") else None
    if reference is None:
        reference = _default_reference(run)
    with local_copy(location) as local_samples:
        result = compute_fid(
            samples=local_samples,
            reference=reference,
            split=split,
            inception=inception,
            num_images=num_images,
            batch_size=batch_size,
            progress=True,
        )
    summary = {**result, "samples": str(location), "reference": str(reference), "split": split}
    if record.get("checkpoint"):
        summary["checkpoint"] = record["checkpoint"]
    json_path = write_json(resolve_location(out) if out else folder / f"fid_{split}.json", summary)
    if run is not None:
        add_to_tensorboard(
            run.run_dir,
            step=run.step,
            scalars={
                f"{name}_{split}": result[key]
                for name, key in TENSORBOARD_SCALARS.items()
                if result[key] is not None  # precision/recall of 3 images or fewer
            },
        )
    return FidResult(
        summary=summary, json_path=json_path, tensorboard_run=run.run_dir if run else None
    )


def _samples_location(samples: str) -> tuple[Path | RemotePath, Path | RemotePath]:
    """(the samples file or folder to read, the folder they sit in). A ``raydiff sample --out``
    folder stands for its npz (its PNGs hold the same pixels)."""
    location = resolve_location(samples)
    if not location.exists():
        raise FileNotFoundError(f"--samples {samples!r} does not exist")
    if not location.is_dir():  # one is_dir call: each is a request on an object store
        return location, location.parent
    npz = sorted(p for p in location.iterdir() if is_npz_name(p.name))
    return (npz[0] if len(npz) == 1 else location), location


def _default_reference(run: RunCheckpoint | None) -> str:
    """The dataset the samples' run trained on."""
    if run is None:
        raise UserInputError(
            "--reference is needed: the samples do not come from a raydiff run's checkpoint "
            "(give a prepared dataset, an npz or an image folder)"
        )
    from raydiff.config import ExperimentConfig, from_dict

    config = from_dict(ExperimentConfig, json.loads((run.checkpoint / "config.json").read_text()))
    return config.data.data_dir
