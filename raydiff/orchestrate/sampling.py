"""``raydiff sample`` on Ray: fixed batches of sample indices spread over sampler actors.

The driver checks everything first (the checkpoint, the weights asked for, the flags, the
options) by loading the model itself, puts its weights in the object store once, and starts
``num_workers`` :class:`SamplerActor` s (one CPU each, or one GPU each). Batches ``[kB, (k+1)B)``
go to whichever actor is free (``ray.util.ActorPool``); sample ``i`` depends only on
``(seed, i)`` (:mod:`raydiff.sample.generate`), so the images are the same on 1 or N workers.
The driver writes improved-diffusion's ``samples_NxHxWxC.npz``, one PNG per sample and a grid.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray

from raydiff.config import DiffusionConfig, ExperimentConfig
from raydiff.errors import UserInputError
from raydiff.sample.generate import generate, index_batches, sample_labels
from raydiff.sample.load import load_sampling_model
from raydiff.sample.options import SampleOptions, sampling_diffusion_config
from raydiff.sample.outputs import write_grid, write_npz, write_pngs

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class SampleResult:
    """What a sampling run wrote, and how fast it went."""

    npz: Path
    grid: Path
    png_dir: Path
    num_samples: int
    seconds: float

    @property
    def samples_per_s(self) -> float:
        return self.num_samples / self.seconds if self.seconds else float("nan")


@ray.remote
class SamplerActor:
    """Builds the model once, then turns batches of sample indices into uint8 images."""

    def __init__(
        self,
        config: ExperimentConfig,
        diffusion_config: DiffusionConfig,
        weights: dict[str, Any],
        threads: int,
    ) -> None:
        import torch

        from raydiff.factory import create_gaussian_diffusion, create_model

        torch.set_num_threads(threads)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = create_model(config.model, learn_sigma=config.diffusion.learn_sigma)
        model.load_state_dict(weights, strict=True)
        self.model = model.eval().to(self.device)
        self.diffusion = create_gaussian_diffusion(diffusion_config)
        self.image_shape = (
            config.model.in_channels,
            config.model.image_size,
            config.model.image_size,
        )

    def run(
        self, indices: range, labels: np.ndarray | None, options: SampleOptions
    ) -> tuple[int, np.ndarray]:
        images = generate(
            self.model,
            self.diffusion,
            indices=indices,
            image_shape=self.image_shape,
            seed=options.seed,
            use_ddim=options.use_ddim,
            eta=options.eta,
            clip_denoised=options.clip_denoised,
            labels=labels,
        )
        return indices.start, images


def run_sampling(options: SampleOptions, *, address: str | None = None) -> SampleResult:
    """Generate ``options.num_samples`` samples on ``options.num_workers`` Ray actors."""
    from ray.util import ActorPool
    from tqdm.auto import tqdm

    from raydiff.orchestrate.trainer import ensure_ray, quiet_ray_console

    out = Path(options.out)
    if out.exists() and any(out.iterdir()):
        raise UserInputError(f"--out {options.out} is not empty: choose a new folder")
    # Every check before Ray starts: the checkpoint loads, the flags fit its keys.
    loaded = load_sampling_model(
        options.checkpoint,
        weights=options.weights,
        model_flags=options.model_flags,
        config_file=options.config_file,
    )
    config = loaded.config
    diffusion_config = sampling_diffusion_config(config, options)  # checks the respacing
    num_classes = config.model.num_classes if config.model.class_cond else None
    if options.class_labels and num_classes is None:
        raise UserInputError("--class-labels given, but the model is not class-conditional")
    batches = index_batches(options.num_samples, options.batch_size)
    labels = {
        b.start: sample_labels(
            options.seed, b, num_classes=num_classes, class_labels=options.class_labels
        )
        if num_classes
        else None
        for b in batches
    }
    ensure_ray(address=address, num_workers=options.num_workers, cpus_per_worker=1.0)
    quiet_ray_console()
    weights = ray.put({k: v.cpu() for k, v in loaded.model.state_dict().items()})
    resources = {"num_gpus": 1} if options.use_gpu else {"num_cpus": 1}
    actors = [
        SamplerActor.options(**resources).remote(config, diffusion_config, weights, 1)
        for _ in range(options.num_workers)
    ]
    logger.info(
        "sampling %d images from %s (%s) on %d worker(s): %s%s, batches of %d, seed %d",
        options.num_samples,
        options.checkpoint,
        loaded.weights.name,
        options.num_workers,
        "DDIM" if options.use_ddim else "ancestral",
        f" respaced {diffusion_config.timestep_respacing}"
        if diffusion_config.timestep_respacing
        else "",
        options.batch_size,
        options.seed,
    )
    pool = ActorPool(actors)
    start = time.monotonic()
    images: dict[int, np.ndarray] = {}
    with tqdm(total=options.num_samples, unit="img", desc="sampling") as bar:
        work = pool.map_unordered(
            lambda actor, b: actor.run.remote(b, labels[b.start], options), batches
        )
        for first, batch in work:
            images[first] = batch
            bar.update(len(batch))
    seconds = time.monotonic() - start
    for actor in actors:
        ray.kill(actor)
    samples = np.concatenate([images[b.start] for b in batches])
    all_labels = np.concatenate([labels[b.start] for b in batches]) if num_classes else None
    npz = write_npz(samples, out, labels=all_labels)
    write_pngs(samples, out / "images")
    grid = write_grid(samples, out / "grid.png")
    return SampleResult(
        npz=npz, grid=grid, png_dir=out / "images", num_samples=len(samples), seconds=seconds
    )
