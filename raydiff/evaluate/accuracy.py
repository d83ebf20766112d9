"""``raydiff evaluate accuracy``: the fraction of labelled images that a clean classifier (the
evaluator) classifies as their label. No Ray.

On samples of a class-conditional or classifier-guided model (the npz's ``arr_1``), it says how
often the samples are recognisably their class (ADM, Dhariwal & Nichol 2021, sec. 5: guidance
trades diversity for this). On a prepared dataset's split it is the evaluator's own test
accuracy. The evaluator must be a clean classifier that did not guide the samples
(:func:`raydiff.evaluate.classifier_features.load_classifier_features`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raydiff.data.image_sources import load_labelled_images
from raydiff.data.manifest import MANIFEST_NAME
from raydiff.evaluate.classifier_features import classifier_accuracy, load_classifier_features
from raydiff.evaluate.report import run_checkpoint, track, write_json
from raydiff.evaluate.samples_fid import (
    check_not_the_guide,
    read_sampling_record,
    sampler_suffix,
    samples_location,
)
from raydiff.storage import check_writable, local_copy, resolve_location


@dataclass(kw_only=True)
class AccuracyResult:
    """The accuracy, what it was computed on, and where it was written."""

    summary: dict[str, Any]
    json_path: Any
    tracked: list[str]
    """Where the samples' run's trackers hold the result (none: they belong to no run)."""


def run_accuracy(
    *,
    samples: str,
    classifier: str,
    split: str = "test",
    num_images: int | None = None,
    out: str | None = None,
) -> AccuracyResult:
    """Accuracy of ``classifier`` on ``samples`` (a ``raydiff sample`` folder or npz with labels,
    or a prepared dataset's ``split``), written to ``accuracy_SPLIT.json`` beside the samples (a
    dataset's: in the classifier's run, ``RUN/evaluation/checkpoint_N/``) or to ``out``."""
    # is_dataset takes any URI for a dataset (without asking the store): a raydiff sample
    # folder in a bucket has no manifest, so the store is asked here.
    dataset = (resolve_location(samples) / MANIFEST_NAME).is_file()
    if dataset:
        source, folder, record = resolve_location(samples), None, {}
    else:
        source, folder = samples_location(samples)
        record = read_sampling_record(folder)
        check_not_the_guide(classifier, record, flag="--classifier")
    evaluator = load_classifier_features(classifier, flag="--classifier")
    name = f"accuracy_{split}.json" if dataset else "accuracy.json"
    if out is not None:
        target = resolve_location(out)
    elif folder is not None:
        target = folder / name
    else:
        evaluator_run = run_checkpoint(classifier)
        target = evaluator_run.results_dir / name if evaluator_run else resolve_location(name)
    check_writable(target.parent, flag="--out" if out is not None else "the results folder")
    if dataset:  # read in place, under a URI too
        images, labels = load_labelled_images(str(source), split=split, limit=num_images)
    else:
        with local_copy(source) as local:
            images, labels = load_labelled_images(local, split=split, limit=num_images)
    accuracy = classifier_accuracy(evaluator, images, labels)
    summary = {
        "accuracy": accuracy,
        "num_images": len(images),
        "samples": str(source),
        "classifier": str(classifier),
        **({"split": split} if dataset else {}),
        **({"checkpoint": record["checkpoint"]} if record.get("checkpoint") else {}),
    }
    json_path = write_json(target, summary)
    sampled_run = run_checkpoint(record["checkpoint"]) if record.get("checkpoint") else None
    tracked = []
    if sampled_run is not None:
        scalars = {f"classifier_accuracy{sampler_suffix(record)}": accuracy}
        tracked = track(sampled_run, scalars=scalars)
    return AccuracyResult(summary=summary, json_path=json_path, tracked=tracked)
