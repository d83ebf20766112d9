"""``raydiff evaluate fid``: FID, KID, precision and recall of a set of samples, filed beside them
and in their run.

Samples written by ``raydiff sample`` know their checkpoint (its ``sampling.json``): the
reference defaults to the dataset that checkpoint's model trained on, and a run's checkpoint
gets the result in its trackers. One Inception pass over each side in this process (no Ray).
``samples`` and ``out`` may be URIs: the samples are downloaded first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raydiff.errors import UserInputError
from raydiff.evaluate.fid import compute_fid
from raydiff.evaluate.report import RunCheckpoint, run_checkpoint, track, write_json
from raydiff.sample.outputs import SAMPLING_RECORD, is_npz_name
from raydiff.storage import StoragePath, check_writable, local_copy, resolve_location

TRACKED_SCALARS = {
    "fid": "fid",
    "kid": "kid_mean",
    "precision": "precision",
    "recall": "recall",
}
"""The run's ``eval/NAME_SPLIT`` scalars, by the result key each holds."""

CLASSIFIER_NAMES = {
    "fid": "fd_classifier",
    "kid_mean": "kd_classifier_mean",
    "kid_std": "kd_classifier_std",
    "precision": "precision_classifier",
    "recall": "recall_classifier",
}
"""The result keys in a classifier's features (``--features``): a Fréchet distance there is not
FID, and is never called so."""


@dataclass(kw_only=True)
class FidResult:
    """FID, KID, precision and recall and what they were computed between, and where they were
    written."""

    summary: dict[str, Any]
    json_path: StoragePath
    tracked: list[str]
    """Where the run's trackers hold the result (none: the samples belong to no run)."""


def run_fid(
    *,
    samples: str,
    reference: str | None,
    split: str = "test",
    inception: str | None = None,
    num_images: int | None = None,
    batch_size: int = 64,
    out: str | None = None,
    features: str | None = None,
    track_in_run: bool = True,
) -> FidResult:
    """FID, KID, precision and recall of ``samples`` against ``reference`` (default: the
    samples' run's dataset), written to ``fid_SPLIT.json`` beside the samples (or ``out``).

    ``features``: a clean raydiff classifier checkpoint whose penultimate features replace
    Inception's; the results are then ``fd_classifier``, ``kd_classifier_mean``, ...
    (:data:`CLASSIFIER_NAMES`) in ``fd_classifier_SPLIT.json``. ``track_in_run``: also log them
    to the samples' run's trackers (a sweep of many weights of one checkpoint logs its own)."""
    location, folder = samples_location(samples)
    record = read_sampling_record(folder)
    run = run_checkpoint(record["checkpoint"]) if record.get("checkpoint") else None
    if reference is None:
        reference = _default_reference(run)
    extractor, names = None, {key: key for key in CLASSIFIER_NAMES}
    if features is not None:
        from raydiff.evaluate.classifier_features import load_classifier_features

        check_not_the_guide(features, record, flag="--features")
        extractor, names = load_classifier_features(features), CLASSIFIER_NAMES
    target = resolve_location(out) if out else folder / f"{names['fid']}_{split}.json"
    check_writable(target.parent, flag="--out" if out else "the samples' folder")  # not after
    with local_copy(location) as local_samples:
        computed = compute_fid(
            samples=local_samples,
            reference=reference,
            split=split,
            inception=inception,
            num_images=num_images,
            batch_size=batch_size,
            extractor=extractor,
            progress=True,
        )
    result = {names.get(key, key): value for key, value in computed.items()}
    summary = {**result, "samples": str(location), "reference": str(reference), "split": split}
    if features is not None:
        summary["features"] = str(features)
    if record.get("checkpoint"):
        summary["checkpoint"] = record["checkpoint"]
    json_path = write_json(target, summary)
    tracked = []
    if run is not None and track_in_run:
        suffix = sampler_suffix(record)
        scalars = {  # precision/recall of 3 images or fewer are None: not logged
            f"{names[key] if features else name}_{split}{suffix}": result[names[key]]
            for name, key in TRACKED_SCALARS.items()
        }
        tracked = track(run, scalars=scalars)
    return FidResult(summary=summary, json_path=json_path, tracked=tracked)


def sampler_suffix(record: Mapping[str, Any]) -> str:
    """How the samples were drawn, as the suffix of their tracked names: the samples of one
    checkpoint by several samplers or guidance scales land on its one step, each under a tag of
    its own. "" for the full ancestral chain, unguided (and for samples with no record);
    ``_respaced250``, ``_ddim25`` (``--use_ddim``, 25 steps), ``_ddim25_eta0.5``, ``_noclip``,
    ``_guided4`` (classifier scale 4), ``_bf16`` / ``_fp16`` (the model's forward autocast:
    ``--precision``) otherwise, as ``bpd_SPLIT_respacedN`` names a respaced bound."""
    respacing = str(record.get("timestep_respacing") or "")
    parts = []
    if record.get("use_ddim"):
        parts.append("ddim" + respacing.removeprefix("ddim"))
        if record.get("eta"):
            parts.append(f"eta{record['eta']:g}")
    elif respacing:
        parts.append(f"respaced{respacing}")
    if record.get("clip_denoised") is False:
        parts.append("noclip")
    if record.get("classifier") and record.get("classifier_scale"):
        parts.append(f"guided{record['classifier_scale']:g}")
    if record.get("precision") in ("bf16", "fp16"):
        parts.append(record["precision"])
    return "".join(f"_{part}" for part in parts)


def read_sampling_record(folder: StoragePath) -> dict[str, Any]:
    """The ``raydiff sample`` options beside the samples ({} for samples from elsewhere)."""
    record_file = folder / SAMPLING_RECORD
    return json.loads(record_file.read_text()) if record_file.is_file() else {}


def check_not_the_guide(evaluator: str, record: dict[str, Any], *, flag: str) -> None:
    """Refuse to evaluate samples with the classifier that guided them: they are made to fool
    it."""
    guide = record.get("classifier")
    if guide and str(resolve_location(evaluator)) == guide:
        raise UserInputError(
            f"{flag} {evaluator} is the classifier that guided these samples: evaluate them "
            "with another, clean one (raydiff train-classifier --config evaluator_demo)"
        )


def samples_location(samples: str) -> tuple[StoragePath, StoragePath]:
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
    return run.config.data.data_dir
