"""``raydiff evaluate bpd``'s work before and after Ray: every check and the images first
(:func:`prepare_bpd`), then the files and the run's tracked scalars of the result
(:func:`file_bpd_results`). The terms in between come from model actors
(:func:`raydiff.orchestrate.model_actor.run_bpd`). No Ray here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from raydiff.config import DiffusionConfig, ExperimentConfig
from raydiff.errors import UserInputError
from raydiff.evaluate.options import BpdOptions
from raydiff.evaluate.report import RunCheckpoint, run_checkpoint, track, write_json
from raydiff.sample.load import SamplingModel, load_sampling_model
from raydiff.storage import MirroredFolder, StoragePath, check_writable, resolve_location


@dataclass(kw_only=True)
class BpdResult:
    """The bound's summary (``bpd``, ``bpd_stderr``, its parts) and where it was written."""

    summary: dict[str, Any]
    json_path: StoragePath
    terms_path: StoragePath
    seconds: float
    tracked: list[str]
    """Where the run's trackers hold the result (none: the checkpoint belongs to no run)."""


@dataclass(kw_only=True)
class BpdJob:
    """A checked evaluation: the model, the chain, the images and where the results go."""

    loaded: SamplingModel
    diffusion_config: DiffusionConfig
    num_timesteps: int
    walk: list[int]
    """The timesteps of the terms, in the order of the terms' columns."""
    source: StoragePath
    run: RunCheckpoint | None
    out: StoragePath
    data_dir: str
    images: np.ndarray
    """float32 ``[N, C, H, W]`` in [-1, 1]."""
    labels: np.ndarray | None
    """The images' classes for a class-conditional model, else None."""


def prepare_bpd(options: BpdOptions) -> BpdJob:
    """Load and check everything ``options`` name. A checkpoint under a URI is downloaded to be
    loaded; its run folder there gets the results, as a local run's does."""
    from raydiff.evaluate.bpd import walk_timesteps
    from raydiff.factory import create_gaussian_diffusion

    source = resolve_location(options.checkpoint)
    loaded = load_sampling_model(
        source,
        weights=options.weights,
        model_flags=options.model_flags,
        config_file=options.config_file,
        or_task="super_res",  # an upsampler's bound: each image given its low-resolution self
    )
    diffusion_config = dataclasses.replace(
        loaded.config.diffusion,
        timestep_respacing=options.timestep_respacing or loaded.config.diffusion.timestep_respacing,
    )
    diffusion = create_gaussian_diffusion(diffusion_config)
    run = run_checkpoint(source)
    if options.out:
        out = resolve_location(options.out)
    elif run is not None:
        out = run.results_dir
    else:
        raise UserInputError(
            f"{options.checkpoint} belongs to no raydiff run: say where the results go with --out"
        )
    check_writable(out, flag="--out" if options.out else "the run's results folder")
    data_dir = options.data or loaded.config.data.data_dir
    images, labels = _split_images(options, loaded.config, data_dir)
    return BpdJob(
        loaded=loaded,
        diffusion_config=diffusion_config,
        num_timesteps=diffusion.num_timesteps,
        walk=walk_timesteps(diffusion),
        source=source,
        run=run,
        out=out,
        data_dir=data_dir,
        images=images,
        labels=labels,
    )


def _split_images(
    options: BpdOptions, config: ExperimentConfig, data_dir: str
) -> tuple[np.ndarray, np.ndarray | None]:
    """The first ``options.num_images`` images of the split (and their classes for a
    class-conditional model), checked against the model's image shape."""
    from raydiff.data.in_memory import load_split_tensors
    from raydiff.data.manifest import load_manifest

    manifest = load_manifest(data_dir)
    manifest.check_split(options.split, setting="--split")
    size, channels = config.model.image_size, config.model.in_channels
    if (manifest.image_size, manifest.channels) != (size, channels):
        raise UserInputError(
            f"dataset {data_dir} holds {manifest.image_size}x{manifest.image_size}x"
            f"{manifest.channels} images; the model takes {size}x{size}x{channels}"
        )
    images, labels, _ = load_split_tensors(
        data_dir, options.split, limit=options.num_images, manifest=manifest
    )
    if config.model.class_cond and labels is None:
        raise UserInputError(
            f"the model is class-conditional but {data_dir} ({options.split}) has no labels"
        )
    return images.numpy(), labels.numpy() if config.model.class_cond else None


def file_bpd_results(
    job: BpdJob,
    options: BpdOptions,
    *,
    terms: dict[str, np.ndarray],
    seconds: float,
    track_in_run: bool = True,
) -> BpdResult:
    """Write the terms and the summary JSON under ``job.out`` (uploaded for a URI), and (with
    ``track_in_run``) log the bound to the run's trackers."""
    from raydiff.evaluate.bpd import summarize_terms, write_terms

    summary = summarize_terms(terms, num_timesteps=job.num_timesteps)
    # A respaced chain's bound, or the bound without clipping, is another quantity: it gets its
    # own files and curve.
    respacing = job.diffusion_config.timestep_respacing
    stem = f"bpd_{options.split}" + (f"_respaced{respacing}" if respacing else "")
    stem += "" if options.clip_denoised else "_noclip"
    result = {
        **summary,
        "split": options.split,
        "data": str(job.data_dir),
        "checkpoint": str(job.source),
        "weights": job.loaded.weights.name,
        "timestep_respacing": respacing,
        "clip_denoised": options.clip_denoised,
        "seed": options.seed,
        "num_workers": options.num_workers,
        "seconds": round(seconds, 1),
        "terms": f"{stem}_terms.npz",
    }
    results = MirroredFolder(job.out)  # written here; uploaded when ``out`` is a URI
    try:
        indices = np.arange(len(job.images))
        terms_file = write_terms(
            results.local / result["terms"], terms, timesteps=job.walk, indices=indices
        )
        terms_path = results.publish(terms_file.name)  # the terms first: the JSON names them
        json_path = results.publish(write_json(results.local / f"{stem}.json", result).name)
    finally:
        results.close()
    tracked = []
    if job.run is not None and track_in_run:
        scalars = {stem: summary["bpd"], f"{stem}_stderr": summary["bpd_stderr"]}
        tracked = track(job.run, scalars=scalars)
    return BpdResult(
        summary=result,
        json_path=json_path,
        terms_path=terms_path,
        seconds=seconds,
        tracked=tracked,
    )
