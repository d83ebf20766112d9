"""``raydiff ema --evaluate`` on Ray: reconstruct EMA lengths, then evaluate every one of them
and the checkpoint's fixed-rate EMAs, and rank them; what is measured follows the run's task
(:attr:`raydiff.train.task.TaskSpec.posthoc_sweep`; for which task what, and what is written
where: docs/posthoc_ema.md). Every check runs before anything is reconstructed or written.
"""

from __future__ import annotations

import dataclasses
import io
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from raydiff.config import ExperimentConfig
from raydiff.config.resolve import saved_config
from raydiff.ema.reconstruction import (
    EmaOptions,
    Reconstructed,
    checkpoint_folder,
    reconstruct_ema,
)
from raydiff.errors import ConfigError, RunInterruptedError, UserInputError
from raydiff.evaluate.ema_sweep_report import SweepReport, SweepRow, write_sweep_report
from raydiff.results_table import Ranking
from raydiff.storage import StoragePath, as_location, check_writable, write_bytes_atomically
from raydiff.tracking import log_evaluation
from raydiff.train.posthoc_ema import rate_to_sigma_rel
from raydiff.train.run_files import POSTHOC_DIR
from raydiff.train.task import TaskSpec
from raydiff.train.tasks import task_spec

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class SweepPlan:
    """A checked sweep: the checkpoint, its model's config and task, what ranks, where to."""

    checkpoint: StoragePath
    step: int
    config: ExperimentConfig
    spec: TaskSpec
    ranking: Ranking
    out: StoragePath
    fixed: list[SweepRow]
    """The checkpoint's fixed-rate EMAs, at the lengths they have at its step."""


def run_ema_sweep(
    options: EmaOptions, *, address: str | None = None
) -> tuple[list[Reconstructed], SweepReport]:
    """Reconstruct ``options``' lengths, evaluate them and the fixed-rate EMAs, and write the
    report; returns what was reconstructed and the report."""
    from raydiff.orchestrate.node_paths import refuse_paths_nodes_cannot_see
    from raydiff.orchestrate.ray_session import ensure_ray, quiet_ray_console

    plan = plan_sweep(options)  # every check before anything is written
    written = reconstruct_ema(options)
    rows = [
        SweepRow(name=w.name, sigma_rel=w.sigma_rel, rate=w.rate, error=w.error) for w in written
    ] + plan.fixed
    ensure_ray(address=address, num_workers=options.num_workers, cpus_per_worker=1.0)
    # The validators read the checkpoint and the reconstructed weights on their nodes.
    refuse_paths_nodes_cannot_see({"--run": plan.checkpoint, "--out": plan.out})
    quiet_ray_console()
    logger.info(
        "evaluating %d weights of %s (%s), ranked by %s",
        len(rows),
        plan.checkpoint,
        plan.spec.posthoc_sweep,
        plan.ranking.key,
    )
    evaluate = _validations if plan.spec.posthoc_sweep == "validation" else _sampled
    evaluated = []
    for index, (row, metrics) in enumerate(
        zip(rows, evaluate(plan, options, rows, address=address), strict=True)
    ):
        shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if v is not None)
        logger.info(
            "[%d/%d] %s (sigma_rel %.4f): %s", index + 1, len(rows), row.name, row.sigma_rel, shown
        )
        evaluated.append(dataclasses.replace(row, metrics=metrics))
    title = f"{as_location(options.run).name}, step {plan.step}"
    report = write_sweep_report(plan.out, evaluated, plan.ranking, title=title)
    scalars = {
        f"ema_sweep/{r.name}/{key}": value for r in evaluated for key, value in r.metrics.items()
    }
    log_evaluation(plan.config, run_dir=plan.checkpoint.parent, step=plan.step, scalars=scalars)
    return written, report


def plan_sweep(options: EmaOptions) -> SweepPlan:
    """Check everything the sweep needs before anything runs: the checkpoint and its task, the
    evaluator (and that it takes the model's images), ``--num-samples``, the val split, and a new
    or empty output folder."""
    run = as_location(options.run)
    checkpoint, step = checkpoint_folder(run, options.step)
    config = saved_config(checkpoint)
    spec = task_spec(config.train.task)
    from raydiff.data.manifest import load_manifest

    if not config.data.val_split:
        raise UserInputError(
            f"the run's data.val_split is empty: --evaluate measures every weights on the val "
            f"split of {config.data.data_dir}"
        )
    load_manifest(config.data.data_dir).check_split(config.data.val_split, setting="data.val_split")
    if spec.posthoc_sweep == "samples":
        ranking = _check_sampling(options, config)
    else:
        if given := options.given("features", "inception", "num_samples"):
            raise UserInputError(
                f"{' / '.join(given)}: the run is train.task={config.train.task}, whose sweep "
                "measures no samples (see docs/posthoc_ema.md): leave them out"
            )
        key = spec.objectives[0]
        ranking = Ranking(key=key, mode=spec.metric(key).objective or "min")
    out = as_location(options.out) if options.out else run / POSTHOC_DIR / f"sweep_{step:07d}"
    if out.exists() and any(out.iterdir()):
        raise UserInputError(
            f"--out {out} is not empty (a sweep of step {step} was run before?): give --out a "
            "new folder, or remove that one"
        )
    check_writable(out, flag="--out")  # a refused bucket now, not after the evaluations
    fixed = [
        SweepRow(
            name=f"ema_{rate}",
            sigma_rel=rate_to_sigma_rel(rate, step=step),
            rate=rate,
            fixed=True,
        )
        for rate in config.optim.ema_rates()
        if (checkpoint / f"ema_{rate}.pt").is_file()
    ]
    return SweepPlan(
        checkpoint=checkpoint,
        step=step,
        config=config,
        spec=spec,
        ranking=ranking,
        out=out,
        fixed=fixed,
    )


def _check_sampling(options: EmaOptions, config: ExperimentConfig) -> Ranking:
    """A diffusion model's sweep: samples, and an evaluator that takes its images."""
    if options.num_samples < 1:
        raise ConfigError(
            section=options.section,
            field="num_samples",
            value=options.num_samples,
            reason="--evaluate on a diffusion model draws samples of every weights: give the "
            "number per weights (e.g. 256)",
        )
    if options.features:
        from raydiff.evaluate.classifier_features import load_classifier_features

        evaluator = load_classifier_features(options.features, flag="--features")
        model = config.model
        if (evaluator.image_size, evaluator.in_channels) != (model.image_size, model.in_channels):
            raise UserInputError(
                f"--features {options.features} takes {evaluator.image_size}x"
                f"{evaluator.image_size}x{evaluator.in_channels} images; the model draws "
                f"{model.image_size}x{model.image_size}x{model.in_channels}: choose an evaluator "
                "trained on the model's data"
            )
        return Ranking(key="fd_classifier", mode="min")
    if not options.inception:
        raise UserInputError(
            "--evaluate on a diffusion model measures its samples: give --features EVALUATOR (a "
            "clean `raydiff train-classifier` checkpoint, e.g. of evaluator_demo) or --inception "
            "WEIGHTS (the FID Inception weights file)"
        )
    if not as_location(options.inception).is_file():
        raise UserInputError(f"--inception {options.inception}: no such file")
    return Ranking(key="fid", mode="min")


def _sampled(
    plan: SweepPlan, options: EmaOptions, rows: list[SweepRow], *, address: str | None
) -> Iterator[dict[str, float | None]]:
    """Each row's figures in turn: its samples' and its val bits/dim."""
    from raydiff.evaluate.options import BpdOptions
    from raydiff.evaluate.samples_fid import run_fid
    from raydiff.orchestrate.model_actor import run_bpd
    from raydiff.orchestrate.sampling import run_sampling
    from raydiff.sample.options import SampleOptions

    suffix = "_classifier" if options.features else ""
    keys = (plan.ranking.key, f"precision{suffix}", f"recall{suffix}")
    low_res = _write_low_res_inputs(plan, options) if plan.spec.low_res_input else None
    for row in rows:
        folder = plan.out / row.name
        # FD, precision and recall of options.num_samples samples of the row's weights (an
        # upsampler's: of the low_res images).
        samples = folder / "samples"
        run_sampling(
            SampleOptions(
                checkpoint=str(plan.checkpoint),
                weights=row.name,
                num_samples=options.num_samples,
                out=str(samples),
                timestep_respacing=options.timestep_respacing,
                use_ddim=options.use_ddim,
                num_workers=options.num_workers,
                seed=options.seed,
                low_res=low_res,
            ),
            address=address,
        )
        fid = run_fid(
            samples=str(samples),
            reference=None,  # the run's dataset
            split=plan.config.data.val_split,
            inception=options.inception,
            features=options.features,
            out=str(folder / f"{plan.ranking.key}.json"),
            track_in_run=False,
        )
        metrics = {key: fid.summary.get(key) for key in keys}
        bpd = run_bpd(
            BpdOptions(
                checkpoint=str(plan.checkpoint),
                weights=row.name,
                split=plan.config.data.val_split,
                num_images=options.num_images,
                timestep_respacing=options.bpd_respacing,
                num_workers=options.num_workers,
                seed=options.seed,
                out=str(folder),
            ),
            address=address,
            track_in_run=False,
        )
        metrics["val_bpd"] = float(bpd.summary["bpd"])
        yield metrics


def _write_low_res_inputs(plan: SweepPlan, options: EmaOptions) -> str:
    """The upsampler's inputs: the first ``--num-samples`` val images shrunk to
    ``super_res.small_size`` as training shrinks them, as a samples npz (with the labels of a
    class-conditional upsampler) under ``SWEEP/low_res/``; its location."""
    from raydiff.data.in_memory import load_split_tensors
    from raydiff.sample.generate import to_uint8
    from raydiff.sample.outputs import npz_name
    from raydiff.train.tasks.super_res import low_res_of

    data = plan.config.data
    images, labels, _ = load_split_tensors(data.data_dir, data.val_split, limit=options.num_samples)
    small = to_uint8(low_res_of(images, plan.config.super_res.small_size))
    arrays = [small] if labels is None or not plan.config.model.class_cond else [small, labels]
    buffer = io.BytesIO()
    np.savez(buffer, *arrays)
    target = plan.out / "low_res" / npz_name(small)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomically(target, buffer.getvalue())
    return str(target)


class WeightsValidator:
    """An actor that runs a task's own validation (``Task.evaluate``) of one checkpoint's
    weights on the val images it holds."""

    def __init__(self, checkpoint: str, config: ExperimentConfig, images: Any, labels: Any) -> None:
        import torch

        torch.set_num_threads(1)
        self.checkpoint = checkpoint
        self.spec = task_spec(config.train.task)
        # A task whose validation reads no runtime (a classifier's): the loop's hooks are unused.
        self.task = self.spec.build(config, runtime=None)  # type: ignore[arg-type]
        # Copies: the object store's arrays are read-only.
        self.images = torch.tensor(images)
        self.labels = torch.tensor(labels)

    def evaluate(self, weights: str, *, seed: int, batch_size: int = 64) -> dict[str, float]:
        """The task's declared validation metrics of ``weights`` (the loop's at an eval)."""
        import torch

        from raydiff.sample.load import load_sampling_model

        loaded = load_sampling_model(self.checkpoint, weights=weights, task=self.spec.name)
        batches = [
            (self.images[i : i + batch_size], {"y": self.labels[i : i + batch_size]})
            for i in range(0, len(self.images), batch_size)
        ]
        with torch.no_grad():
            totals = self.task.evaluate(loaded.model.eval(), batches, seed=seed)
        metrics = self.task.evaluation_metrics(totals)
        declared = {m.key for m in self.spec.metrics}
        return {k: v for k, v in metrics.items() if k in declared}


def _validations(
    plan: SweepPlan, options: EmaOptions, rows: list[SweepRow], *, address: str | None
) -> Iterator[dict[str, float | None]]:
    """Each row's validation metrics in turn, ``options.num_workers`` weights at a time."""
    import ray
    from ray.util import ActorPool

    from raydiff.data.in_memory import load_split_tensors
    from raydiff.orchestrate.driver_signals import StopSignal, sigterm_as_ctrl_c

    data = plan.config.data
    images, labels, _ = load_split_tensors(data.data_dir, data.val_split, limit=options.num_images)
    if labels is None:
        raise UserInputError(f"{data.data_dir} ({data.val_split}) has no labels to validate on")
    images_ref, labels_ref = ray.put(images.numpy()), ray.put(labels.numpy())
    actor_class = ray.remote(num_cpus=1)(WeightsValidator)
    actors = [
        actor_class.remote(str(plan.checkpoint), plan.config, images_ref, labels_ref)
        for _ in range(min(options.num_workers, len(rows)))
    ]
    stopped = StopSignal()
    try:
        with sigterm_as_ctrl_c() as stopped:
            yield from ActorPool(actors).map(
                lambda actor, row: actor.evaluate.remote(row.name, seed=options.seed), rows
            )
    except KeyboardInterrupt as error:
        raise RunInterruptedError(
            f"stopped by {stopped.described}; the weights evaluated so far are in the log, "
            "no table was written",
            signal_name=stopped.name,
        ) from error
    finally:
        for actor in actors:
            ray.kill(actor)
