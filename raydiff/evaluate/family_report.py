"""The ``evaluate`` stage of ``raydiff family`` and its report: every sample set of the family
judged in the evaluator's features against its data, beside each model's final metrics.

The rows (each shows one part's effect by leaving it out):

- ``family``: the guided cascade (base model, classifier guidance, upsampler);
- ``unguided cascade`` (with a classifier): the same without guidance;
- ``base model alone`` (with an upsampler): the cascade's own base samples, enlarged to the
  evaluator's size with bicubic filtering instead of the upsampler.

Each row's FD, precision and recall in the evaluator's features
(:func:`raydiff.evaluate.samples_fid.run_fid`) and, for samples with labels (guided or
class-conditional), the evaluator's accuracy on them (:func:`raydiff.evaluate.accuracy.run_accuracy`).
Written to ``DIR/report.md``, ``DIR/report.json``, ``DIR/report.csv`` (the samples' table) and
``DIR/report.png`` (the family's samples beside the data's); each row's figures to
``DIR/evaluate/<row>/``. ``DIR`` may be a URI: the samples are read through local copies and
what is written here with local file APIs (an enlarged npz, the grid) is uploaded.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from raydiff.family.spec import Family
from raydiff.results_table import cell, csv_text
from raydiff.storage import MirroredFolder, StoragePath, local_copy, write_bytes_atomically
from raydiff.train.checkpoint import latest_checkpoint, read_metrics
from raydiff.train.tasks import task_spec

GRID_IMAGES = 64


@dataclass(frozen=True, kw_only=True)
class SampleSet:
    """One row: its name, what it is, and its samples' folder (enlarged first if ``enlarge``)."""

    name: str
    description: str
    folder: StoragePath
    enlarge: bool = False


def sample_sets(family: Family, *, out: StoragePath) -> list[SampleSet]:
    """The rows of ``family``'s report, where its ``sample`` stage wrote them."""
    guided = "classifier" in family.stages
    cascade = "upsampler" in family.stages
    scale = family.sample.classifier_scale

    def samples(run: str) -> StoragePath:
        folder = out / "sample" / run
        return folder / "upsampled" if cascade else folder

    parts = ["base model", *([f"classifier guidance (scale {scale:g})"] if guided else [])]
    parts += ["upsampler"] if cascade else []
    rows = [
        SampleSet(
            name="family",
            description=" + ".join(parts),
            folder=samples("guided" if guided else "unguided"),
        )
    ]
    if guided:
        rows.append(
            SampleSet(
                name="unguided",
                description=" + ".join(p for p in parts if not p.startswith("classifier")),
                folder=samples("unguided"),
            )
        )
    if cascade:
        rows.append(
            SampleSet(
                name="base_alone",
                description=" + ".join(p for p in parts if p != "upsampler") + " + bicubic",
                folder=out / "sample" / ("guided" if guided else "unguided") / "base",
                enlarge=True,
            )
        )
    return rows


def write_family_report(family: Family, *, out: StoragePath) -> StoragePath:
    """Judge every row, then write the report; returns ``DIR/report.md``."""
    evaluator = str(latest_checkpoint(out / "evaluator"))
    sets = sample_sets(family, out=out)
    rows = [
        {"name": s.name, "description": s.description, **judge(s, family, evaluator, out=out)}
        for s in sets
    ]
    report = {
        "family": family.source,
        "evaluator": evaluator,
        "reference": f"{family.stages['evaluator'].config.data.data_dir} ({family.evaluate.split})",
        "models": model_metrics(family, out=out),
        "samples": rows,
    }
    write_bytes_atomically(out / "report.json", json.dumps(report, indent=2).encode())
    write_bytes_atomically(out / "report.md", report_markdown(report).encode())
    write_bytes_atomically(out / "report.csv", samples_csv(rows).encode())
    write_report_grid(family, out=out, samples=sets[0].folder)
    return out / "report.md"


def judge(
    sample_set: SampleSet, family: Family, evaluator: str, *, out: StoragePath
) -> dict[str, Any]:
    """FD, precision, recall (and accuracy, for labelled samples) of one row."""
    from raydiff.evaluate.accuracy import run_accuracy
    from raydiff.evaluate.samples_fid import run_fid

    folder = out / "evaluate" / sample_set.name
    samples = sample_set.folder
    if sample_set.enlarge:
        samples = enlarged(samples, size=family.final_size, out=folder / "bicubic")
    evaluation = family.evaluate
    fid = run_fid(
        samples=str(samples),
        reference=family.stages["evaluator"].config.data.data_dir,
        split=evaluation.split,
        num_images=evaluation.num_images or None,
        features=evaluator,
        out=str(folder / "fd_classifier.json"),
        track_in_run=False,
    ).summary
    figures = {key: fid.get(f"{key}_classifier") for key in ("fd", "precision", "recall")} | {
        "num_samples": fid.get("num_samples"),
        "accuracy": None,
    }
    if has_labels(samples):
        accuracy = run_accuracy(
            samples=str(samples), classifier=evaluator, out=str(folder / "accuracy.json")
        )
        figures["accuracy"] = accuracy.summary["accuracy"]
    return figures


@contextlib.contextmanager
def samples_npz(folder: StoragePath) -> Iterator[Any]:
    """The samples npz in ``folder`` opened (``np.load``; a remote one from a local copy)."""
    from raydiff.sample.outputs import is_npz_name

    npz = next(p for p in sorted(folder.iterdir(), key=str) if is_npz_name(p.name))
    with local_copy(npz) as local, np.load(local) as archive:
        yield archive


def has_labels(folder: StoragePath) -> bool:
    with samples_npz(folder) as archive:
        return "arr_1" in archive.files


def enlarged(folder: StoragePath, *, size: int, out: StoragePath) -> StoragePath:
    """The samples of ``folder`` enlarged to ``size`` with PIL's bicubic filter, as ``raydiff
    prepare`` enlarges a small source (labels kept), written as a samples npz into ``out``."""
    from PIL import Image

    from raydiff.data.resize import resize_center_crop
    from raydiff.sample.outputs import write_npz

    with samples_npz(folder) as archive:
        images = archive["arr_0"]
        labels = archive["arr_1"] if "arr_1" in archive.files else None
    channels = images.shape[-1]
    big = np.stack(
        [
            np.asarray(
                resize_center_crop(
                    Image.fromarray(image[..., 0] if channels == 1 else image), image_size=size
                )
            ).reshape(size, size, channels)
            for image in images
        ]
    )
    written = MirroredFolder(out)
    try:
        npz = write_npz(big, written.local, labels=labels)
        written.publish(npz.name)
    finally:
        written.close()
    return out


def model_metrics(family: Family, *, out: StoragePath) -> dict[str, dict[str, Any]]:
    """Each trained model's final step and headline metrics (its checkpoint's ``metrics.json``)."""
    models = {}
    for name, stage in family.stages.items():
        checkpoint = latest_checkpoint(out / name)
        numbers = read_metrics(checkpoint) if checkpoint is not None else {}
        spec = task_spec(stage.config.train.task)
        headline = [m.key for m in spec.metrics if m.headline]
        models[name] = {
            "checkpoint": str(checkpoint),
            "step": numbers.get("step"),
            **{key: numbers[key] for key in headline if key in numbers},
        }
    return models


def report_markdown(report: dict[str, Any]) -> str:
    """``report.md``: the models' table, then the samples' table."""
    keys = sorted({k for m in report["models"].values() for k in m} - {"checkpoint", "step"})
    lines = [
        f"# Family report: {report['family']}",
        "",
        "| model | step | " + " | ".join(keys) + " | checkpoint |",
        "|---|---:|" + "---:|" * len(keys) + "---|",
    ]
    for name, model in report["models"].items():
        cells = [cell(model.get(k)) for k in keys]
        lines.append(
            f"| {name} | {cell(model['step'])} | {' | '.join(cells)} | {model['checkpoint']} |"
        )
    lines += [
        "",
        f"Samples against {report['reference']} in the features of {report['evaluator']}:",
        "",
        "| samples | what | FD | precision | recall | accuracy | images |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in report["samples"]:
        figures = [cell(row[k]) for k in ("fd", "precision", "recall", "accuracy", "num_samples")]
        lines.append(f"| {row['name']} | {row['description']} | {' | '.join(figures)} |")
    return "\n".join(lines) + "\n"


def samples_csv(rows: list[dict[str, Any]]) -> str:
    """``report.csv``: the samples' table (what a tracking backend keeps of the report)."""
    return csv_text(list(rows[0]), [list(row.values()) for row in rows])


def write_report_grid(family: Family, *, out: StoragePath, samples: StoragePath) -> StoragePath:
    """``report.png``: the first :data:`GRID_IMAGES` of the family's samples (left) beside as
    many of the evaluator's data (right)."""
    from raydiff.data.in_memory import read_split_pixels
    from raydiff.data.manifest import load_manifest
    from raydiff.train.sample_grid import save_png, tile

    with samples_npz(samples) as archive:
        drawn = archive["arr_0"][:GRID_IMAGES]
    manifest = load_manifest(family.stages["evaluator"].config.data.data_dir)
    data, _ = read_split_pixels(manifest, family.evaluate.split, limit=len(drawn))
    left, right = tile(drawn, columns=8), tile(data, columns=8)
    gap = np.full((left.shape[0], 8, left.shape[2]), 255, np.uint8)
    written = MirroredFolder(out)  # a URI's png is written locally, then uploaded
    try:
        save_png(np.concatenate([left, gap, right], axis=1), written.local / "report.png")
        return written.publish("report.png")
    finally:
        written.close()
