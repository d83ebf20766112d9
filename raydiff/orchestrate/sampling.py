"""``raydiff sample`` on Ray: fixed batches of sample indices spread over model actors
(:mod:`raydiff.orchestrate.model_actor`: the same images on 1 or N workers).

The driver checks everything first (the checkpoint, the weights asked for, the flags, the
options) by loading the model itself, and writes improved-diffusion's ``samples_NxHxWxC.npz``,
one PNG per sample and a grid.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from raydiff.config import DiffusionConfig, ExperimentConfig
from raydiff.errors import UserInputError
from raydiff.orchestrate.model_actor import map_batches_in_order, model_actors
from raydiff.sample.classifier import Guidance
from raydiff.sample.generate import auto_batch_limit, index_batches, sample_labels
from raydiff.sample.load import SamplingModel, load_sampling_model
from raydiff.sample.low_res import LowResImages, check_cascade, load_low_res
from raydiff.sample.options import SampleOptions, cascade_stages, sampling_diffusion_config
from raydiff.sample.outputs import write_sampling_outputs
from raydiff.storage import StoragePath, check_writable, resolve_location

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class SampleResult:
    """What a sampling run wrote (local paths, or URIs for an ``--out`` URI), and how fast."""

    npz: StoragePath
    grid: StoragePath
    png_dir: StoragePath
    num_samples: int
    seconds: float
    base: SampleResult | None = None
    """A cascade's first stage (the base model's samples); None otherwise."""

    @property
    def samples_per_s(self) -> float:
        return self.num_samples / self.seconds if self.seconds else float("nan")


def run_sampling(options: SampleOptions, *, address: str | None = None) -> SampleResult:
    """Generate ``options.num_samples`` samples on ``options.num_workers`` Ray actors (with
    ``--upsampler``: a cascade of the base model and the upsampler, see :func:`_run_cascade`)."""
    out = resolve_location(options.out)  # a local folder, or a URI (s3://, gs://, ...)
    if out.exists() and any(out.iterdir()):
        raise UserInputError(f"--out {options.out} is not empty: choose a new folder")
    check_writable(out, flag="--out")  # a refused bucket now, not after the sampling
    if options.upsampler:
        return _run_cascade(options, address=address)
    # Every check before Ray starts: the checkpoint loads (downloaded first from a URI), the
    # flags fit its keys.
    return _sample(options, _load(options), address=address)


def _load(options: SampleOptions) -> SamplingModel:
    """The model of ``options`` (an upsampler when it samples from ``--low-res``)."""
    return load_sampling_model(
        options.checkpoint,
        weights=options.weights,
        model_flags=options.model_flags,
        config_file=options.config_file,
        task="super_res" if options.low_res else "diffusion",
    )


def _run_cascade(options: SampleOptions, *, address: str | None) -> SampleResult:
    """The base model's samples (``OUT/base``), then the upsampler's on them
    (``OUT/upsampled``), each stage on the actors with its own steps. Both models load, and the
    base's images are checked against the upsampler's input, before either stage starts."""
    base_options, upsampler_options = cascade_stages(options)
    base = _load(base_options)
    upsampler = _load(upsampler_options)
    sampling_diffusion_config(upsampler.config, upsampler_options)  # checks the respacing
    _, base_classes = _guidance_and_classes(base_options, base.config)
    check_cascade(base.config, upsampler.config, base_classes=base_classes, name=options.upsampler)
    first = _sample(base_options, base, address=address)
    second = _sample(upsampler_options, upsampler, address=address)
    return dataclasses.replace(second, base=first)


def _sample(options: SampleOptions, loaded: SamplingModel, *, address: str | None) -> SampleResult:
    """One sampling run of the loaded model: checks, the actors, the outputs."""
    from raydiff.orchestrate.ray_session import ensure_ray, quiet_ray_console

    out = resolve_location(options.out)
    diffusion_config = sampling_diffusion_config(loaded.config, options)  # checks the respacing
    low_res = load_low_res(options.low_res, config=loaded.config) if options.low_res else None
    guidance, labels = _guidance_and_labels(options, loaded.config, low_res)
    ensure_ray(address=address, num_workers=options.num_workers, cpus_per_worker=1.0)
    quiet_ray_console()
    respacing = diffusion_config.timestep_respacing
    logger.info(
        "sampling %d images from %s (%s) on %d worker(s): %s%s%s, batches of %s, seed %d",
        options.num_samples,
        options.checkpoint,
        loaded.weights.name,
        options.num_workers,
        "DDIM" if options.use_ddim else "ancestral",
        f" respaced {respacing}" if respacing else "",
        f", classifier guidance scale {options.classifier_scale}" if guidance else "",
        options.batch_size or "the largest that fits",
        options.seed,
    )
    start = time.monotonic()
    samples, resolved = _samples_on_actors(
        options, loaded, diffusion_config, guidance, labels, low_res
    )
    seconds = time.monotonic() - start
    record = {
        **dataclasses.asdict(options),
        "checkpoint": str(resolve_location(options.checkpoint)),
        **resolved,  # precision and batch_size as the actors' devices resolved them
        # Resolved, so an evaluator can be told from the network that guided the samples.
        "classifier": str(resolve_location(options.classifier)) if options.classifier else None,
        "low_res": low_res.source if low_res else None,
    }
    npz = write_sampling_outputs(samples, out, labels=labels, record=record)
    return SampleResult(
        npz=npz,
        grid=out / "grid.png",
        png_dir=out / "images",
        num_samples=len(samples),
        seconds=seconds,
    )


def _guidance_and_labels(
    options: SampleOptions, config: ExperimentConfig, low_res: LowResImages | None
) -> tuple[Guidance | None, np.ndarray | None]:
    """The guidance classifier (None without ``--classifier``) and the samples' labels, their
    ``arr_1``: the classes of a class-conditional model, those a classifier guided towards, or
    an upsampler's inputs' (None: unconditional and unguided)."""
    if low_res is not None:
        return None, low_res.labels_of(options.num_samples)
    guidance, num_classes = _guidance_and_classes(options, config)
    if not num_classes:
        return guidance, None
    return guidance, sample_labels(
        options.seed,
        range(options.num_samples),
        num_classes=num_classes,
        class_labels=options.class_labels,
    )


def _guidance_and_classes(
    options: SampleOptions, config: ExperimentConfig
) -> tuple[Guidance | None, int | None]:
    """The guidance classifier (None without ``--classifier``) and the number of classes the
    samples get labels of (None: unconditional and unguided)."""
    num_classes = config.model.num_classes if config.model.class_cond else None
    guidance = None
    if options.classifier:
        from raydiff.sample.classifier import check_guides, load_classifier
        from raydiff.sample.load import parse_model_flags

        flags = parse_model_flags(options.classifier_flags) if options.classifier_flags else None
        classifier = load_classifier(
            options.classifier,
            flags=flags,
            model_config=config,
            weights=options.classifier_weights,
        )
        check_guides(classifier.config, config, name=f"--classifier {options.classifier}")
        num_classes = classifier.config.model.num_classes
        guidance = Guidance.of(classifier, scale=options.classifier_scale)
    if options.class_labels and num_classes is None:
        raise UserInputError(
            "--class-labels given, but the model is not class-conditional (and no --classifier)"
        )
    return guidance, num_classes


def _samples_on_actors(
    options: SampleOptions,
    loaded: SamplingModel,
    diffusion_config: DiffusionConfig,
    guidance: Guidance | None,
    labels: np.ndarray | None,
    low_res: LowResImages | None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """uint8 ``[N, H, W, C]`` samples, batches spread over ``options.num_workers`` actors (an
    upsampler's low-resolution images go to the object store once), and the precision and
    batch size they were drawn in (``auto`` and ``0`` resolved)."""
    import ray
    from tqdm.auto import tqdm

    with (
        model_actors(
            loaded.config,
            diffusion_config,
            loaded.model.state_dict(),
            num_workers=options.num_workers,
            use_gpu=options.use_gpu,
            guidance=guidance,
        ) as actors,
        tqdm(total=options.num_samples, unit="img", desc="sampling") as bar,
    ):
        precision = _precision_on(actors, options.precision)
        batch_size = options.batch_size or _fitting_batch(actors, options)
        parts = map_batches_in_order(
            actors,
            index_batches(options.num_samples, batch_size),
            "sample",
            labels,
            options,
            progress=bar,
            low_res=ray.put(low_res.images) if low_res is not None else None,
        )
    return np.concatenate(parts), {"precision": precision, "batch_size": batch_size}


def _fitting_batch(actors: list[Any], options: SampleOptions) -> int:
    """``--batch-size 0``: the largest batch that fits every actor's GPU (one batch size for
    all of them: the batches are planned before any is handed out)."""
    import ray

    limit = auto_batch_limit(num_samples=options.num_samples, num_workers=options.num_workers)
    batch = min(ray.get([a.fitting_batch.remote(limit, options.precision) for a in actors]))
    logger.info("--batch-size 0: batches of %d, the largest that fits (at most %d)", batch, limit)
    return batch


def _precision_on(actors: list[Any], precision: str) -> str:
    """What ``--precision`` resolves to on the actors: one precision for all of them, or a
    sample would depend on the actor that drew it."""
    import ray

    resolved = sorted(set(ray.get([a.sampling_precision.remote(precision) for a in actors])))
    if len(resolved) > 1:
        raise UserInputError(
            f"--precision {precision} resolves to {' and '.join(resolved)} on the sampling "
            "actors' GPUs (of several kinds): give --precision fp32, bf16 or fp16"
        )
    if precision == "auto":
        logger.info("--precision auto: %s on the sampling actors", resolved[0])
    return resolved[0]
