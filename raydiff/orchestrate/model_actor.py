"""Ray actors that hold one model and turn fixed batches of work into results.

``raydiff sample``, ``raydiff evaluate bpd`` and checkpoint evaluation during training all cut
their work into batches whose result depends only on the batch (sample ``i`` on ``(seed, i)``,
image ``i``'s bound on ``(seed, i)``), hand the batches to whichever :class:`ModelActor` is free
(``ray.util.ActorPool``) and put the results back in batch order: the same output on 1 or N
workers. The actor builds its model once from weights the driver put in the object store.
:func:`run_bpd` is ``raydiff evaluate bpd``'s (each of the ``T`` terms costs one model call per
image: the demo model, T = 1000, takes ~10 s per image per CPU thread); sampling's is
:mod:`raydiff.orchestrate.sampling`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import ray

from raydiff.config import CompileMode, DiffusionConfig, ExperimentConfig
from raydiff.errors import RunInterruptedError
from raydiff.orchestrate.driver_signals import StopSignal, sigterm_as_ctrl_c

if TYPE_CHECKING:
    from raydiff.evaluate.bpd_job import BpdResult
    from raydiff.evaluate.options import BpdOptions
    from raydiff.sample.classifier import Guidance

logger = logging.getLogger(__name__)


@ray.remote
class ModelActor:
    """One model (and optionally a guidance classifier) on this actor's CPU thread or GPU."""

    def __init__(
        self,
        config: ExperimentConfig,
        diffusion_config: DiffusionConfig,
        weights: dict[str, Any],
        *,
        guidance: Guidance | None = None,
    ) -> None:
        import torch

        from raydiff.factory import create_gaussian_diffusion
        from raydiff.train.tasks import task_spec

        torch.set_num_threads(1)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        spec = task_spec(config.train.task)
        model = spec.network(config)
        model.load_state_dict(weights, strict=True)
        if config.model.use_fp16 and self.device.type == "cuda":
            model.convert_to_fp16()  # improved-diffusion's --use_fp16: half precision on GPU only
        self.model = model.eval().to(self.device)
        self.compiled_model: torch.nn.Module | None = None  # built by the first compiled batch
        self.low_res_size = config.super_res.small_size if spec.low_res_input else None
        self.diffusion = create_gaussian_diffusion(diffusion_config)
        size = config.model.image_size
        self.image_shape = (config.model.in_channels, size, size)
        self.cond_fn = guidance.cond_fn(self.device) if guidance is not None else None

    def sample(
        self,
        indices: range,
        labels: np.ndarray | None,
        options: Any,
        low_res: np.ndarray | None = None,
    ) -> tuple[int, np.ndarray]:
        """``(indices.start, uint8 [N, H, W, C] samples)`` of the samples ``indices``
        (``labels``: the classes of all samples, or None; ``options``: a ``SampleOptions``;
        ``low_res``: an upsampler's uint8 low-resolution images, sample i upsampling image
        i % len)."""
        from raydiff.sample.generate import generate
        from raydiff.sample.low_res import model_input_of

        return indices.start, generate(
            self.sampling_model(options.compile),
            self.diffusion,
            indices=indices,
            image_shape=self.image_shape,
            seed=options.seed,
            use_ddim=options.use_ddim,
            eta=options.eta,
            clip_denoised=options.clip_denoised,
            labels=labels[indices.start : indices.stop] if labels is not None else None,
            cond_fn=self.cond_fn,
            low_res=None if low_res is None else model_input_of(low_res, indices),
            precision=options.precision,
        )

    def sampling_precision(self, precision: str) -> str:
        """What ``precision`` (``--precision``) resolves to on this actor's device (fp16 on a
        CPU is refused)."""
        from raydiff.sample.generate import sampling_precision
        from raydiff.train.precision import native_cpu_bf16

        resolved = sampling_precision(precision, device=self.device)
        if resolved == "bf16" and self.device.type == "cpu" and not native_cpu_bf16():
            logger.warning(
                "--precision bf16 on a CPU without native bf16 kernels (no AVX512-BF16/AMX): "
                "oneDNN emulates them, several times slower than fp32"
            )
        return resolved

    def fitting_batch(self, limit: int, precision: str) -> int:
        """``--batch-size 0``: the largest power of two up to ``limit`` whose sampling step (the
        model's forward in ``precision``, and the classifier's gradient when guided) fits this
        actor's GPU with a tenth of its free memory to spare; on a CPU the default batch. The
        eager model is probed: probing the compiled one would compile every size tried."""
        from raydiff.sample.generate import (
            CPU_AUTO_BATCH,
            largest_fitting_batch,
            sampling_precision,
        )
        from raydiff.train.precision import autocast_model

        if self.device.type != "cuda":
            return min(CPU_AUTO_BATCH, limit)
        resolved = sampling_precision(precision, device=self.device)
        net = autocast_model(self.model, resolved, device=self.device)
        return largest_fitting_batch(functools.partial(self._step_fits, net), limit=limit)

    def _step_fits(self, net: Any, batch: int) -> bool:
        """Whether one sampling step of ``batch`` samples runs within 90% of the GPU's free
        memory (an out-of-memory error: it does not): the model's forward (with an upsampler's
        input, a class-conditional model's classes) and the classifier's gradient when guided;
        zeros stand in for the images."""
        import torch

        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(self.device)
        before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        try:
            x = torch.zeros((batch, *self.image_shape), device=self.device)
            t = torch.zeros(batch, dtype=torch.long, device=self.device)
            y = torch.zeros(batch, dtype=torch.long, device=self.device)
            kwargs: dict[str, Any] = {}
            if getattr(self.model, "num_classes", None) is not None:
                kwargs["y"] = y
            if self.low_res_size is not None:
                size = (batch, self.image_shape[0], self.low_res_size, self.low_res_size)
                kwargs["low_res"] = torch.zeros(size, device=self.device)
            with torch.no_grad():
                net(x, t, **kwargs)
            if self.cond_fn is not None:
                self.cond_fn(x, t, y=y)
        except torch.cuda.OutOfMemoryError:
            return False
        used = torch.cuda.max_memory_allocated(self.device) - before
        return used <= 0.9 * free

    def sampling_model(self, mode: CompileMode) -> Any:
        """The model the sampling loop calls: compiled once per actor where ``mode``
        (``--compile``) asks for it on this actor's device, else the model as loaded."""
        from raydiff.config import compile_wanted
        from raydiff.train.compilation import compile_static

        if not compile_wanted(mode, cuda=self.device.type == "cuda"):
            return self.model
        if self.compiled_model is None:
            self.compiled_model = compile_static(self.model)
        return self.compiled_model

    def bpd(
        self,
        indices: range,
        images: np.ndarray,
        labels: np.ndarray | None,
        *,
        seed: int,
        clip_denoised: bool,
    ) -> tuple[int, dict[str, np.ndarray]]:
        """``(indices.start, every term of the bound)`` for the images ``indices`` of ``images``
        (all of the split's, float ``[N, C, H, W]`` in [-1, 1]; ``labels``: theirs, or None)."""
        import torch

        from raydiff.evaluate.bpd import image_bpd_terms

        return indices.start, image_bpd_terms(
            self.model,
            self.diffusion,
            # Copies: the arrays are read-only views of the object store.
            images=torch.tensor(images[indices.start : indices.stop]),
            indices=indices,
            seed=seed,
            labels=None if labels is None else torch.tensor(labels[indices.start : indices.stop]),
            clip_denoised=clip_denoised,
            low_res_size=self.low_res_size,
        )


@contextlib.contextmanager
def model_actors(
    config: ExperimentConfig,
    diffusion_config: DiffusionConfig,
    weights: dict[str, Any],
    *,
    num_workers: int,
    use_gpu: bool,
    guidance: Guidance | None = None,
) -> Iterator[list[Any]]:
    """``num_workers`` actors of one CPU (one thread) or one GPU each, sharing one copy of the
    weights in the object store; killed when the block ends, by an error or Ctrl-C too (a
    driver joined to a cluster would otherwise leave them holding its CPUs or GPUs)."""
    weights_ref = ray.put({k: v.cpu() for k, v in weights.items()})
    # One copy in the object store; a top-level argument, where Ray resolves an object ref.
    guidance_ref = ray.put(guidance) if guidance is not None else None
    resources = {"num_gpus": 1} if use_gpu else {"num_cpus": 1}
    actors = [
        ModelActor.options(**resources).remote(
            config, diffusion_config, weights_ref, guidance=guidance_ref
        )
        for _ in range(num_workers)
    ]
    try:
        yield actors
    finally:
        for actor in actors:
            ray.kill(actor)


def map_batches_in_order(
    actors: list[Any],
    batches: list[range],
    method: str,
    *args: Any,
    progress: Any = None,
    **kwargs: Any,
) -> list[Any]:
    """``actor.<method>.remote(batch, *args, **kwargs)`` (whose result is ``(batch.start,
    value)``) for every batch on whichever actor is free; returns the values in ``batches``'
    order. Large arguments should be object refs (``ray.put``): each call then reads one copy in
    the object store instead of shipping its own. ``progress``: a tqdm bar, advanced by each
    batch's size as its result arrives."""
    from ray.util import ActorPool

    by_start = {b.start: b for b in batches}
    values: dict[int, Any] = {}
    stopped = StopSignal()
    try:
        # ray.init replaced Python's SIGTERM handler with Ray's (a C++ stack trace, an abort).
        with sigterm_as_ctrl_c() as stopped:
            calls = ActorPool(actors).map_unordered(
                lambda actor, batch: getattr(actor, method).remote(batch, *args, **kwargs), batches
            )
            for start, value in calls:
                values[start] = value
                if progress is not None:
                    progress.update(len(by_start[start]))
    except KeyboardInterrupt as error:
        done = sum(len(by_start[start]) for start in values)
        total = sum(len(b) for b in batches)
        raise RunInterruptedError(
            f"stopped by {stopped.described} after {done} of {total} images; nothing was written (the "
            "outputs are written once every image is done)",
            signal_name=stopped.name,
        ) from error
    return [values[b.start] for b in batches]


def run_bpd(
    options: BpdOptions, *, address: str | None = None, track_in_run: bool = True
) -> BpdResult:
    """``raydiff evaluate bpd``: the bound in bits/dim of ``options.split``'s images under the
    checkpoint's model, every check first (:func:`raydiff.evaluate.bpd_job.prepare_bpd`), the
    images in fixed batches over model actors; ``track_in_run``: also in its run's trackers (a
    sweep of many weights logs its own)."""
    from tqdm.auto import tqdm

    from raydiff.evaluate.bpd import concatenate_terms
    from raydiff.evaluate.bpd_job import file_bpd_results, prepare_bpd
    from raydiff.orchestrate.ray_session import ensure_ray, quiet_ray_console
    from raydiff.sample.generate import index_batches

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
    # Every term of the bound of every image, batches spread over the model actors; in order.
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
    terms = concatenate_terms(parts)
    seconds = time.monotonic() - start
    return file_bpd_results(job, options, terms=terms, seconds=seconds, track_in_run=track_in_run)
