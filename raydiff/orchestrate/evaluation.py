"""``raydiff evaluate bpd`` on Ray: the full variational bound over a split, images spread over
model actors.

The driver checks everything first and decodes the split's first ``num_images`` images
(:func:`raydiff.evaluate.bpd_job.prepare_bpd`), then hands fixed batches of them to
:class:`raydiff.orchestrate.model_actor.ModelActor` s. Image ``i``'s terms depend only on
``(seed, i)`` (:mod:`raydiff.evaluate.bpd`), so the result is the same on 1 or N workers. Each of
the ``T`` terms costs one model call per image: the demo model (T = 1000) takes ~10 s per image
per CPU thread here. FID needs no Ray (one Inception pass per side):
:func:`raydiff.evaluate.samples_fid.run_fid`.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from raydiff.evaluate.bpd_job import BpdJob, BpdResult, file_bpd_results, prepare_bpd
from raydiff.evaluate.options import BpdOptions

__all__ = ["BpdResult", "run_bpd"]

logger = logging.getLogger(__name__)


def run_bpd(
    options: BpdOptions, *, address: str | None = None, track_in_run: bool = True
) -> BpdResult:
    """The bound in bits/dim of ``options.split``'s images under the checkpoint's model;
    ``track_in_run``: also in its run's trackers (a sweep of many weights logs its own)."""
    from raydiff.orchestrate.ray_session import ensure_ray, quiet_ray_console

    job = prepare_bpd(options)  # every check before Ray starts
    ensure_ray(address=address, num_workers=options.num_workers, cpus_per_worker=1.0)
    quiet_ray_console()
    logger.info(
        "bits/dim of %d %s images of %s under %s (%s): %d terms each, on %d worker(s)",
        len(job.images),
        options.split,
        job.data_dir,
        options.checkpoint,
        job.loaded.weights.name,
        job.num_timesteps + 1,
        options.num_workers,
    )
    start = time.monotonic()
    terms = _bound_on_actors(job, options)
    seconds = time.monotonic() - start
    return file_bpd_results(job, options, terms=terms, seconds=seconds, track_in_run=track_in_run)


def _bound_on_actors(job: BpdJob, options: BpdOptions) -> dict[str, np.ndarray]:
    """Every term of the bound of every image, batches spread over ``options.num_workers``
    model actors; in image order."""
    import ray
    from tqdm.auto import tqdm

    from raydiff.evaluate.bpd import concatenate_terms
    from raydiff.orchestrate.model_actor import map_batches_in_order, model_actors
    from raydiff.sample.generate import index_batches

    with (
        model_actors(
            job.loaded.config,
            job.diffusion_config,
            job.loaded.model.state_dict(),
            num_workers=options.num_workers,
            use_gpu=options.use_gpu,
        ) as actors,
        tqdm(total=len(job.images), unit="img", desc="bits/dim") as bar,
    ):
        parts = map_batches_in_order(
            actors,
            index_batches(len(job.images), options.batch_size),
            "bpd",
            ray.put(job.images),  # one copy in the object store for every batch
            ray.put(job.labels) if job.labels is not None else None,
            seed=options.seed,
            clip_denoised=options.clip_denoised,
            progress=bar,
        )
    return concatenate_terms(parts)
