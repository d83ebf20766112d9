"""``raydiff evaluate bpd`` on Ray: the full variational bound over a split, images spread over
model actors.

The driver checks everything first (the checkpoint, the dataset and split, where results go),
decodes the split's first ``num_images`` images, and hands fixed batches of them to
:class:`raydiff.orchestrate.model_actor.ModelActor` s. Image ``i``'s terms depend only on
``(seed, i)`` (:mod:`raydiff.evaluate.bpd`), so the result is the same on 1 or N workers. Each of
the ``T`` terms costs one model call per image: the demo model (T = 1000) takes ~10 s per image
per CPU thread here.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raydiff.errors import UserInputError
from raydiff.evaluate.options import BpdOptions
from raydiff.storage import MirroredFolder, RemotePath, local_copy, resolve_location

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class FidResult:
    """FID/KID and what they were computed between, and where they were written."""

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
    """FID and KID of ``samples`` against ``reference`` in this process (no Ray: one Inception
    pass over each side). Samples written by ``raydiff sample`` know their checkpoint: the
    reference defaults to its dataset, and a run's checkpoint gets the result in its TensorBoard.
    ``samples`` and ``out`` may be URIs (the samples are downloaded first).
    """
    import json

    from raydiff.evaluate.fid import compute_fid
    from raydiff.evaluate.report import add_to_tensorboard, run_checkpoint, write_json
    from raydiff.sample.outputs import SAMPLING_RECORD, is_npz_name

    location = resolve_location(samples)
    if not location.exists():
        raise FileNotFoundError(f"--samples {samples!r} does not exist")
    given_folder = location.is_dir()
    folder = location if given_folder else location.parent
    if given_folder:
        # A `raydiff sample --out` folder: its npz (the PNGs hold the same pixels).
        npz = sorted(p for p in folder.iterdir() if is_npz_name(p.name))
        if len(npz) == 1:
            location = npz[0]
    record_file = folder / SAMPLING_RECORD
    record = json.loads(record_file.read_text()) if record_file.is_file() else {}
    run = run_checkpoint(record["checkpoint"]) if record.get("checkpoint") else None
    if reference is None:
        if run is None:
            raise UserInputError(
                "--reference is needed: the samples do not come from a raydiff run's checkpoint "
                "(give a prepared dataset, an npz or an image folder)"
            )
        from raydiff.config import ExperimentConfig, from_dict

        config = from_dict(
            ExperimentConfig, json.loads((run.checkpoint / "config.json").read_text())
        )
        reference = config.data.data_dir
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
            scalars={f"fid_{split}": result["fid"], f"kid_{split}": result["kid_mean"]},
        )
    return FidResult(
        summary=summary, json_path=json_path, tensorboard_run=run.run_dir if run else None
    )


@dataclass(kw_only=True)
class BpdResult:
    """The bound's summary (``bpd``, ``bpd_stderr``, its parts) and where it was written."""

    summary: dict[str, Any]
    json_path: Path | RemotePath
    terms_path: Path | RemotePath
    seconds: float
    tensorboard_run: Path | RemotePath | None
    """The run whose TensorBoard got the result (None: the checkpoint belongs to no run)."""


def run_bpd(options: BpdOptions, *, address: str | None = None) -> BpdResult:
    """The bound in bits/dim of ``options.split``'s images under the checkpoint's model."""
    from tqdm.auto import tqdm

    from raydiff.data.in_memory import load_split_tensors
    from raydiff.data.manifest import load_manifest
    from raydiff.evaluate.bpd import concatenate_terms, summarize_terms, walk_timesteps, write_terms
    from raydiff.evaluate.report import add_to_tensorboard, run_checkpoint, write_json
    from raydiff.factory import create_gaussian_diffusion
    from raydiff.orchestrate.model_actor import map_batches_in_order, model_actors
    from raydiff.orchestrate.trainer import ensure_ray, quiet_ray_console
    from raydiff.sample.generate import index_batches
    from raydiff.sample.load import load_sampling_model

    # Every check before Ray starts. A checkpoint under a URI is downloaded to be loaded; its
    # run folder there gets the results, as a local run's does.
    source = resolve_location(options.checkpoint)
    loaded = load_sampling_model(
        source,
        weights=options.weights,
        model_flags=options.model_flags,
        config_file=options.config_file,
    )
    config = loaded.config
    diffusion_config = dataclasses.replace(
        config.diffusion,
        timestep_respacing=options.timestep_respacing or config.diffusion.timestep_respacing,
    )
    diffusion = create_gaussian_diffusion(diffusion_config)
    run = run_checkpoint(source)
    out: Path | RemotePath
    if options.out:
        out = resolve_location(options.out)
    elif run is not None:
        out = run.results_dir
    else:
        raise UserInputError(
            f"{options.checkpoint} belongs to no raydiff run: say where the results go with --out"
        )
    data_dir = options.data or config.data.data_dir
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
    x = images.numpy()
    y = labels.numpy() if labels is not None and config.model.class_cond else None
    batches = index_batches(len(x), options.batch_size)

    ensure_ray(address=address, num_workers=options.num_workers, cpus_per_worker=1.0)
    quiet_ray_console()
    logger.info(
        "bits/dim of %d %s images of %s under %s (%s): %d terms each, on %d worker(s)",
        len(x),
        options.split,
        data_dir,
        options.checkpoint,
        loaded.weights.name,
        diffusion.num_timesteps + 1,
        options.num_workers,
    )
    start = time.monotonic()
    with (
        model_actors(
            config,
            diffusion_config,
            loaded.model.state_dict(),
            num_workers=options.num_workers,
            use_gpu=options.use_gpu,
        ) as actors,
        tqdm(total=len(x), unit="img", desc="bits/dim") as bar,
    ):
        parts = map_batches_in_order(
            actors,
            batches,
            lambda actor, b: actor.bpd.remote(
                b,
                x[b.start : b.stop],
                y[b.start : b.stop] if y is not None else None,
                seed=options.seed,
                clip_denoised=options.clip_denoised,
            ),
            on_result=lambda b, _: bar.update(len(b)),
        )
    seconds = time.monotonic() - start
    terms = concatenate_terms(parts)
    summary = summarize_terms(terms, num_timesteps=diffusion.num_timesteps)
    # A respaced chain's bound, or the bound without clipping, is another quantity: it gets its
    # own files and curve.
    respacing = diffusion_config.timestep_respacing
    stem = f"bpd_{options.split}" + (f"_respaced{respacing}" if respacing else "")
    stem += "" if options.clip_denoised else "_noclip"
    result = {
        **summary,
        "split": options.split,
        "data": str(data_dir),
        "checkpoint": str(source),
        "weights": loaded.weights.name,
        "timestep_respacing": diffusion_config.timestep_respacing,
        "clip_denoised": options.clip_denoised,
        "seed": options.seed,
        "num_workers": options.num_workers,
        "seconds": round(seconds, 1),
        "terms": f"{stem}_terms.npz",
    }
    results = MirroredFolder(out)  # written here; uploaded when ``out`` is a URI
    try:
        terms_file = write_terms(
            results.local / result["terms"],
            terms,
            timesteps=walk_timesteps(diffusion),
            indices=np.arange(len(x)),
        )
        terms_path = results.publish(terms_file.name)  # the terms first: the JSON names them
        json_path = results.publish(write_json(results.local / f"{stem}.json", result).name)
    finally:
        results.close()
    if run is not None:
        add_to_tensorboard(
            run.run_dir,
            step=run.step,
            scalars={f"{stem}": summary["bpd"], f"{stem}_stderr": summary["bpd_stderr"]},
        )
    return BpdResult(
        summary=result,
        json_path=json_path,
        terms_path=terms_path,
        seconds=seconds,
        tensorboard_run=run.run_dir if run is not None else None,
    )
