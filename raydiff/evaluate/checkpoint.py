"""One checkpoint's evaluation during training: samples, the full bound on val images, FID.

``evaluate_checkpoint`` is what the run's evaluation actor does for every checkpoint the run
saves (``raydiff train --evaluate-checkpoints``, the ``evaluation`` config section): from the
checkpoint's first EMA weights it draws ``num_samples`` samples (the same seed at every
checkpoint, so grids compare over the run), computes the full variational bound of the first
``bpd_images`` val images (the same images and noise every time) and, given Inception weights,
FID/KID of the samples against the val split. Everything goes to
``RUN/evaluation/checkpoint_NNNNNN/``, one line per checkpoint to ``RUN/evaluation/metrics.jsonl``
and ``eval/*`` to the run's trackers. No Ray here.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from raydiff.config import EvaluationConfig, ExperimentConfig
from raydiff.evaluate.report import RESULTS_DIR, RunCheckpoint, track, write_json
from raydiff.seeding import derive_seed
from raydiff.storage import MirroredFolder, StoragePath, append_line, as_location

if TYPE_CHECKING:
    import torch

    from raydiff.data.manifest import Manifest

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
"""``RUN/evaluation/metrics.jsonl``: one JSON object per evaluated checkpoint, in order done."""
SAMPLE_BATCH = 64
BPD_BATCH = 16


SCALARS = ("bpd_val", "fid", "kid_mean", "precision", "recall", "seconds")
"""A checkpoint evaluation's figures: the trackers' scalars, the log line, the run's summary."""


def evaluate_checkpoint(
    checkpoint: str | StoragePath,
    *,
    run_dir: str | StoragePath,
    step: int,
    options: EvaluationConfig,
) -> dict[str, Any]:
    """Evaluate ``checkpoint`` (step ``step`` of the run in ``run_dir``) as ``options`` say;
    returns the result written to ``RUN/evaluation/checkpoint_NNNNNN/evaluation.json``, and
    logged with the samples' grid to the run's trackers. A run folder under a URI gets the same
    files: written here, then uploaded (the checkpoint is downloaded to be loaded)."""
    from raydiff.train.sample_grid import tile

    start = time.monotonic()
    checkpoint, run_dir = as_location(checkpoint), as_location(run_dir)
    results = MirroredFolder(run_dir / RESULTS_DIR / checkpoint.name)
    try:
        result, samples, npz = _evaluate(checkpoint, out=results.local, step=step, options=options)
        result["samples"] = str(results.target / npz.name)
        result["seconds"] = round(time.monotonic() - start, 1)
        write_json(results.local / "evaluation.json", result)
        for name in (npz.name, "grid.png", "evaluation.json"):  # the JSON last: it names them
            results.publish(name)
    finally:
        results.close()
    # The run's one evaluator, one checkpoint at a time, is this file's only writer.
    append_line(run_dir / RESULTS_DIR / METRICS_FILE, json.dumps(result))
    scalars = {k: v for k, v in result.items() if k in SCALARS and v is not None}
    run = RunCheckpoint(run_dir=run_dir, checkpoint=checkpoint, step=step)
    track(run, scalars=scalars, images={"samples": tile(samples)})
    logger.info(
        "evaluated %s in %.0f s: %s",
        checkpoint.name,
        result["seconds"],
        "  ".join(f"{k} {v:.4g}" for k, v in scalars.items()),
    )
    return result


def _evaluate(
    checkpoint: StoragePath, *, out: Path, step: int, options: EvaluationConfig
) -> tuple[dict[str, Any], np.ndarray, Path]:
    """The evaluation itself, its samples' npz and grid written into the local folder ``out``:
    (the result so far, the samples, the npz)."""
    import torch

    from raydiff.data.manifest import load_manifest
    from raydiff.sample.generate import sampling_precision
    from raydiff.sample.load import load_sampling_model

    loaded = load_sampling_model(checkpoint)
    # A GPU run's evaluator holds a GPU (raydiff.orchestrate.training_job): sample and bound there.
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loaded.model.to(device)
    config = loaded.config
    seed = derive_seed(config.train.seed, "checkpoint-evaluation")
    result: dict[str, Any] = {"step": step, "checkpoint": str(checkpoint)}
    result["weights"] = loaded.weights.name
    result["sample_precision"] = sampling_precision(options.sample_precision, device=device)
    samples, npz = _write_samples(loaded.model, config, options=options, seed=seed, out=out)
    data_dir = config.data.data_dir
    manifest = load_manifest(data_dir)
    has_val = "val" in manifest.splits
    if options.bpd_images and has_val:
        bound = _val_bound(loaded.model, config, manifest, options=options, seed=seed)
        result.update(bound)
    elif options.bpd_images:
        result["bpd_val_skipped"] = f"dataset {data_dir} has no val split"
    if options.inception and has_val:
        from raydiff.evaluate.fid import compute_fid

        fid = compute_fid(
            samples=str(npz), reference=str(data_dir), split="val", inception=options.inception
        )
        wanted = ("fid", "kid_mean", "kid_std", "precision", "recall")
        result.update({k: v for k, v in fid.items() if k in wanted})
    return result, samples, npz


def _write_samples(
    model: torch.nn.Module,
    config: ExperimentConfig,
    *,
    options: EvaluationConfig,
    seed: int,
    out: Path,
) -> tuple[np.ndarray, Path]:
    """``options.num_samples`` samples, the same indices and seed at every checkpoint, written
    to ``out`` as the npz and ``grid.png``: (the samples, the npz)."""
    from raydiff.factory import create_gaussian_diffusion
    from raydiff.sample.generate import generate, index_batches, sample_labels
    from raydiff.sample.outputs import write_grid, write_npz

    sampler = create_gaussian_diffusion(options.sampling_diffusion(config.diffusion))
    image_shape = (config.model.in_channels, config.model.image_size, config.model.image_size)
    num_classes = config.model.num_classes if config.model.class_cond else None
    labels = None
    if num_classes:
        labels = sample_labels(seed, range(options.num_samples), num_classes=num_classes)
    parts = [
        generate(
            model,
            sampler,
            indices=b,
            image_shape=image_shape,
            seed=seed,
            use_ddim=options.sample_respacing.startswith("ddim"),
            labels=labels[b.start : b.stop] if labels is not None else None,
            precision=options.sample_precision,
        )
        for b in index_batches(options.num_samples, SAMPLE_BATCH)
    ]
    samples = np.concatenate(parts)
    npz = write_npz(samples, out, labels=labels)
    write_grid(samples, out / "grid.png")
    return samples, npz


def _val_bound(
    model: torch.nn.Module,
    config: ExperimentConfig,
    manifest: Manifest,
    *,
    options: EvaluationConfig,
    seed: int,
) -> dict[str, Any]:
    """The full bound of the first ``options.bpd_images`` val images (the same images and noise
    at every checkpoint): ``bpd_val``, ``bpd_val_stderr``, ``bpd_val_images``."""
    from raydiff.data.in_memory import load_split_tensors
    from raydiff.evaluate.bpd import concatenate_terms, image_bpd_terms, summarize_terms
    from raydiff.factory import create_gaussian_diffusion
    from raydiff.sample.generate import index_batches

    images, labels, _ = load_split_tensors(config.data.data_dir, "val", limit=options.bpd_images)
    if not config.model.class_cond:
        labels = None
    diffusion = create_gaussian_diffusion(config.diffusion)
    parts = [
        image_bpd_terms(
            model,
            diffusion,
            images=images[b.start : b.stop],
            indices=b,
            seed=seed,
            labels=labels[b.start : b.stop] if labels is not None else None,
        )
        for b in index_batches(len(images), BPD_BATCH)
    ]
    summary = summarize_terms(concatenate_terms(parts), num_timesteps=diffusion.num_timesteps)
    return {
        "bpd_val": summary["bpd"],
        "bpd_val_stderr": summary["bpd_stderr"],
        "bpd_val_images": summary["num_images"],
    }
