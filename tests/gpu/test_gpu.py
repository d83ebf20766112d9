"""The GPU paths, on a CUDA machine (tier ``gpu`` by directory; skipped without CUDA).

Run them with ``make test-gpu`` (``pytest -m gpu``). They cover:

* one single-process training step on CUDA in fp16 (autocast and dynamic loss scaling) and one in
  bf16 (autocast, no scaling), of a diffusion model and of an upsampler (``SuperResModel``),
  through ``run_single_process``, and one on the GPU that ``scaling.use_gpu`` picks when no
  device is given;
* one Ray Train worker on a GPU in fp16, through ``run_training_job``;
* two DDP workers over NCCL (Ray Train's ``TorchTrainer`` with ``TorchConfig``: raydiff asks for
  one GPU per worker with ``scaling.use_gpu``), through ``run_training_job``, when the machine has
  two GPUs or more;
* sampling on a GPU actor (``raydiff sample --use-gpu``, whose ``--compile auto`` compiles the
  model there), in fp32 compared with the same samples drawn eagerly on the CPU, and under
  ``--precision auto`` (bf16 or fp16 autocast) compared with the GPU's fp32 samples, of a
  diffusion model and of an upsampler given low-resolution images (``--low-res``);
* the keyed noise streams (``raydiff.core.keyed_noise``) on CUDA: the same integer stream as on
  the CPU, bit for bit, and the same normals to the rounding of ``log``/``cos``/``sin``;
* ``raydiff sample --batch-size 0`` on a GPU actor (the largest batch that fits);
* the checkpoint evaluator (``--evaluate-checkpoints``) sampling on the GPU in
  ``evaluation.sample_precision``'s auto;
* ``train.compile``: the run that ``scaling.use_gpu`` puts on the GPU compiles (``auto``) and
  saves its compiled artefacts in the run folder; the compiled step against the eager one in
  fp16 and bf16 (losses within rounding, no recompile after the first step); a compiled run's
  previews (compiled, autocast in ``train.precision=auto``) at every step. The other training
  tests set ``train.compile=false``: each compile takes a while.

Everything is the tiny 16x16x1 model of the other tiers: seconds per test once CUDA is up.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_model import tiny_batches, tiny_model, tiny_rank_optimizer

from raydiff.config import ExperimentConfig, apply_overrides
from raydiff.train.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[2]
BATCH = 8
TASKS = {"diffusion": (), "super_res": ("train.task=super_res", "super_res.small_size=8")}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared 16x16x1 dataset of 64 random images (train only)."""
    from raydiff.data import PrepareOptions, prepare_dataset

    root = tmp_path_factory.mktemp("gpu_data")
    rng = np.random.default_rng(0)
    np.savez(root / "images.npz", rng.integers(0, 256, (64, 16, 16), dtype=np.uint8))
    prepare_dataset(
        PrepareOptions(
            source=str(root / "images.npz"),
            out=str(root / "data"),
            image_size=16,
            channels=1,
            val_count=0,
            num_workers=1,
            progress=False,
        )
    )
    return root / "data"


def config(dataset: Path, *overrides: str) -> ExperimentConfig:
    return apply_overrides(
        ExperimentConfig(),
        [
            *tiny_model(attention="8"),
            "diffusion.diffusion_steps=100",
            "diffusion.learn_sigma=true",
            f"train.batch_size={BATCH}",
            "train.max_steps=2",
            "train.log_interval=1",
            "train.save_interval=2",
            "train.eval_interval=0",
            "train.sample_interval=0",
            "scaling.num_workers=1",
            f"data.data_dir={dataset}",
            "data.val_split=",
            "train.compile=false",  # compiled: where a test says so (a compile takes a while)
            *overrides,
        ],
    )


def train_one_process(cfg: ExperimentConfig, out: Path, device: torch.device) -> dict:
    from raydiff.train.local import run_single_process

    return run_single_process(cfg, output_dir=out, device=device)


def test_keyed_noise_on_cuda_is_the_cpus() -> None:
    from raydiff.core.keyed_noise import RowNoise, row_keys, splitmix64

    cpu_keys = row_keys(2**63 + 12345, range(300), device="cpu")
    cuda_keys = row_keys(2**63 + 12345, range(300), device="cuda")
    assert torch.equal(cuda_keys.cpu(), cpu_keys)
    assert torch.equal(splitmix64(cuda_keys).cpu(), splitmix64(cpu_keys))
    shape = (300, 3, 32, 32)
    cpu, cuda = RowNoise(cpu_keys).draw(shape), RowNoise(cuda_keys).draw(shape)
    assert cuda.device.type == "cuda"
    torch.testing.assert_close(cuda.cpu(), cpu, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_training_step_on_cuda(precision: str, task: str, dataset: Path, tmp_path: Path) -> None:
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    cfg = config(dataset, f"train.precision={precision}", *TASKS[task])
    result = train_one_process(cfg, tmp_path / "run", torch.device("cuda"))
    assert result["step"] == 2
    assert math.isfinite(result["loss"]) and result["loss"] > 0
    if precision == "fp16":
        # Dynamic loss scaling is on: the scale starts at train.initial_loss_scale and halves
        # on a step with overflowing gradients (at most one of two steps may skip).
        assert result["skipped_steps"] <= 1
        assert result["loss_scale"] in (2.0**16, 2.0**15)
    else:
        assert result["loss_scale"] == 1.0 and result["skipped_steps"] == 0
    # Master weights (and the EMA's) stay fp32 and finite whatever the compute precision.
    state = load_checkpoint(Path(result["checkpoint"]))
    for weights in (state["model"], *state["ema"].values()):
        assert all(w.dtype == torch.float32 for w in weights.values())
        assert all(torch.isfinite(w).all() for w in weights.values())


def test_single_process_trains_on_the_gpu_with_use_gpu(dataset: Path, tmp_path: Path) -> None:
    """`raydiff train --single-process --set scaling.use_gpu=true`: no device given, the run
    picks the GPU itself (CUDA allocations happen), as a Ray run's workers do."""
    from raydiff.train.local import run_single_process

    before = torch.cuda.memory_stats().get("allocation.all.allocated", 0)
    cfg = config(dataset, "scaling.use_gpu=true", "train.precision=fp32", "train.compile=auto")
    result = run_single_process(cfg, output_dir=tmp_path / "run")
    assert result["step"] == 2 and math.isfinite(result["loss"])
    assert torch.cuda.memory_stats().get("allocation.all.allocated", 0) > before
    # train.compile=auto compiles on CUDA, and the run keeps what it compiled for a restart.
    assert (tmp_path / "run" / "compile_cache" / "artifacts.bin").stat().st_size > 0


def test_the_checkpoint_evaluator_samples_on_the_gpu(dataset: Path, tmp_path: Path) -> None:
    from raydiff.config import EvaluationConfig
    from raydiff.evaluate.checkpoint import evaluate_checkpoint

    cfg = config(dataset, "scaling.use_gpu=true")
    train_one_process(cfg, tmp_path / "run", torch.device("cuda"))
    options = EvaluationConfig(num_samples=4, sample_respacing="ddim5", bpd_images=0)
    result = evaluate_checkpoint(
        tmp_path / "run" / "checkpoint_000002", run_dir=tmp_path / "run", step=2, options=options
    )
    expected = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    assert result["sample_precision"] == expected  # auto, resolved on the GPU
    with np.load(result["samples"]) as data:
        assert data["arr_0"].shape == (4, 16, 16, 1)


def test_a_compiled_run_previews_on_cuda_in_its_precision(dataset: Path, tmp_path: Path) -> None:
    """A compiled run's previews call the compiled view of the raw model under autocast in the
    run's precision (auto: bf16, or fp16 on a GPU without it) at every step."""
    from PIL import Image

    from raydiff.train.local import run_single_process

    cfg = config(
        dataset,
        "scaling.use_gpu=true",
        "train.precision=auto",
        "train.compile=true",
        "train.sample_interval=1",
        "train.sample_count=4",
        "train.sample_steps=5",
    )
    result = run_single_process(cfg, output_dir=tmp_path / "run")
    assert result["step"] == 2 and math.isfinite(result["loss"])
    for step in (1, 2):
        grid = np.asarray(Image.open(tmp_path / "run" / "samples" / f"samples_{step:06d}.png"))
        assert grid.std() > 0  # images, not a blank or a NaN grid


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_compiled_step_on_cuda_gives_the_eager_losses_without_recompiling(
    precision: str,
) -> None:
    """The tiny UNet's step (two microbatches, clipping, the loss-aware sampler) compiled by
    inductor for CUDA against the eager step, three steps from the same weights."""
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    eager = tiny_rank_optimizer(compiled=False, precision=precision, device="cuda")
    compiled = tiny_rank_optimizer(compiled=True, precision=precision, device="cuda")
    try:
        for step, batch in enumerate(tiny_batches(3)):
            with torch.compiler.set_stance("fail_on_recompile" if step else "default"):
                got = compiled.optimize(batch)
            want = eager.optimize(batch)
            assert got.stepped == want.stepped
            torch.testing.assert_close(
                got.losses["loss"], want.losses["loss"], rtol=0.05, atol=0.02
            )
    finally:
        torch.compiler.reset()


@pytest.fixture(scope="module")
def ray_on_gpus() -> Iterator[None]:
    """A local Ray instance that sees this machine's GPUs (shut down after the module)."""
    import ray

    os.environ["RAY_AUTH_MODE"] = "disabled"  # throwaway instance: no token files
    # Workers import raydiff (and the test's functions) from this checkout.
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    ray.init(num_cpus=max(4, os.cpu_count() or 4), include_dashboard=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_one_gpu_worker_trains_through_ray_train(
    ray_on_gpus: None, dataset: Path, tmp_path: Path
) -> None:
    from raydiff.orchestrate.training_job import run_training_job

    cfg = config(
        dataset,
        "scaling.use_gpu=true",
        "scaling.cpus_per_worker=1",
        "scaling.max_failures=0",
        "train.precision=fp16",
    )
    result = run_training_job(cfg, output_dir=tmp_path / "run")
    assert result["step"] == 2 and math.isfinite(result["loss"])
    # The worker trained under fp16 autocast with dynamic loss scaling on its GPU.
    assert result["loss_scale"] in (2.0**16, 2.0**15) and result["skipped_steps"] <= 1
    state = load_checkpoint(Path(result["checkpoint"]))
    assert all(w.dtype == torch.float32 for w in state["model"].values())
    assert all(torch.isfinite(w).all() for w in state["model"].values())


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="DDP over NCCL needs two GPUs or more",
)
def test_two_workers_train_over_nccl(ray_on_gpus: None, dataset: Path, tmp_path: Path) -> None:
    from raydiff.orchestrate.training_job import run_training_job

    cfg = config(
        dataset,
        "scaling.num_workers=2",
        "scaling.use_gpu=true",
        "scaling.cpus_per_worker=1",
        "scaling.max_failures=0",
        "train.precision=bf16" if torch.cuda.is_bf16_supported() else "train.precision=fp16",
    )
    result = run_training_job(cfg, output_dir=tmp_path / "run")
    assert result["step"] == 2 and math.isfinite(result["loss"])
    state = load_checkpoint(Path(result["checkpoint"]))
    # Each rank's weight fingerprint, recorded at the checkpoint: the ranks drew different
    # batches, so they hold the same weights only because NCCL all-reduced their gradients.
    fingerprints = state["trainer"]["rank_weight_fingerprints"]
    assert len(fingerprints) == 2 and fingerprints[0] == fingerprints[1]
    assert all(torch.isfinite(w).all() for w in state["model"].values())


@pytest.mark.parametrize("task", TASKS)
def test_sampling_on_a_gpu_actor_matches_the_cpu(
    task: str, ray_on_gpus: None, dataset: Path, tmp_path: Path
) -> None:
    from raydiff.orchestrate.sampling import run_sampling
    from raydiff.sample.options import SampleOptions

    trained = train_one_process(
        config(dataset, *TASKS[task]), tmp_path / "run", torch.device("cpu")
    )
    low_res = None
    if task == "super_res":  # 4 random 8x8 images to upsample
        low_res = tmp_path / "low_res.npz"
        rng = np.random.default_rng(1)
        np.savez(low_res, rng.integers(0, 256, (4, 8, 8, 1), dtype=np.uint8))
    samples = {}
    for use_gpu in (True, False):
        out = tmp_path / ("gpu" if use_gpu else "cpu")
        result = run_sampling(
            SampleOptions(
                checkpoint=trained["checkpoint"],
                num_samples=4,
                out=str(out),
                timestep_respacing="ddim10",
                use_ddim=True,
                batch_size=4,
                use_gpu=use_gpu,
                precision="fp32",  # --precision auto on CUDA: the next test
                seed=3,
                low_res=None if low_res is None else str(low_res),
            )
        )
        samples[use_gpu] = np.load(result.npz)["arr_0"]
    assert samples[True].shape == (4, 16, 16, 1)
    # The starting noise is drawn on the CPU from (seed, index) on both: DDIM is deterministic
    # from there, so the GPU's images differ from the CPU's by rounding only (TF32 convolutions
    # included); other images would differ by ~85 levels on average.
    difference = np.abs(samples[True].astype(int) - samples[False].astype(int))
    assert difference.mean() < 2.0 and difference.max() <= 16


@pytest.mark.parametrize("task", TASKS)
def test_sampling_under_precision_auto_on_cuda(
    task: str, ray_on_gpus: None, dataset: Path, tmp_path: Path
) -> None:
    """``--precision auto`` on a GPU actor (eager: compiled sampling is the test above's): bf16
    where the GPU has it, else fp16, recorded in sampling.json; the samples close to the same
    GPU's fp32 ones, the same bytes when drawn again, and the same images in batches of another
    size up to the rounding of other shapes."""
    import json

    from raydiff.orchestrate.sampling import run_sampling
    from raydiff.sample.options import SampleOptions

    trained = train_one_process(
        config(dataset, *TASKS[task]), tmp_path / "run", torch.device("cpu")
    )
    low_res = None
    if task == "super_res":
        low_res = tmp_path / "low_res.npz"
        rng = np.random.default_rng(1)
        np.savez(low_res, rng.integers(0, 256, (8, 8, 8, 1), dtype=np.uint8))

    def sample(name: str, *, precision: str = "auto", batch_size: int = 4) -> np.ndarray:
        result = run_sampling(
            SampleOptions(
                checkpoint=trained["checkpoint"],
                num_samples=8,
                out=str(tmp_path / name),
                timestep_respacing="ddim10",
                use_ddim=True,
                batch_size=batch_size,
                use_gpu=True,
                precision=precision,
                compile="false",  # compiled sampling on a GPU: the test above
                seed=3,
                low_res=None if low_res is None else str(low_res),
            )
        )
        return np.load(result.npz)["arr_0"].astype(int)

    auto, fp32 = sample("auto"), sample("fp32", precision="fp32")
    used = json.loads((tmp_path / "auto" / "sampling.json").read_text())["precision"]
    assert used == ("bf16" if torch.cuda.is_bf16_supported() else "fp16")
    # The tiny model's bf16 DDIM samples were 0.5 levels (of 255) from its fp32 ones on a CPU;
    # two different samples differ by ~100.
    assert np.abs(auto - fp32).mean() < 3.0
    np.testing.assert_array_equal(sample("again"), auto)
    assert np.abs(sample("pairs", batch_size=2) - auto).mean() < 1.0


def test_batch_size_zero_takes_the_largest_batch_that_fits(
    ray_on_gpus: None, dataset: Path, tmp_path: Path
) -> None:
    """``--batch-size 0`` on a GPU actor: the tiny model's step fits at the largest batch tried
    (a worker's share, 64), recorded in sampling.json; the samples are those of that batch size
    given explicitly."""
    import json

    from raydiff.orchestrate.sampling import run_sampling
    from raydiff.sample.options import SampleOptions

    trained = train_one_process(config(dataset), tmp_path / "run", torch.device("cpu"))

    def sample(batch_size: int) -> np.ndarray:
        out = tmp_path / f"batch{batch_size}"
        result = run_sampling(
            SampleOptions(
                checkpoint=trained["checkpoint"],
                num_samples=64,
                out=str(out),
                timestep_respacing="ddim5",
                use_ddim=True,
                batch_size=batch_size,
                use_gpu=True,
                compile="false",  # compiled sampling on a GPU: its own test
            )
        )
        assert json.loads((out / "sampling.json").read_text())["batch_size"] == 64
        return np.load(result.npz)["arr_0"]

    np.testing.assert_array_equal(sample(0), sample(64))
