"""torch.compile with inductor on the CPU (slow tier by directory: a cold compile of the tiny UNet's
training step takes about a minute on 2 cores).

* A compiled ``raydiff train --single-process`` run, stopped at step 2 and resumed to step 4:
  the resumed process loads the run's compiled artefacts (``compile_cache/``) and its first step
  is much faster than the cold one; its losses and weights are an eager run's within rounding.
* A compiled sampler draws the eager sampler's images.

bf16 autocast under inductor is checked on CUDA (tests/gpu) and by ``python bench/compile_step.py
--precision bf16`` on a CPU (the compiled step's losses beside the eager step's): here it would
add three minutes of compiling.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_model import tiny_model, tiny_unet

from raydiff.config import DiffusionConfig
from raydiff.factory import create_gaussian_diffusion
from raydiff.sample.generate import generate
from raydiff.train.checkpoint import load_checkpoint, read_metrics
from raydiff.train.compilation import compile_static

REPO = Path(__file__).resolve().parents[2]
FIRST_STEP = re.compile(r"step (\d+), this process's first, took ([0-9.]+) s")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared 8x8x1 dataset (train and val splits)."""
    from raydiff.data import PrepareOptions, prepare_dataset

    root = tmp_path_factory.mktemp("compile_data")
    rng = np.random.default_rng(0)
    np.savez(root / "tiny.npz", rng.integers(0, 256, (40, 8, 8, 1), dtype=np.uint8))
    prepare_dataset(
        PrepareOptions(
            source=str(root / "tiny.npz"), out=str(root / "data"), image_size=8, channels=1
        )
    )
    return root / "data"


def train(data: Path, out: Path, *, max_steps: int, compile: str) -> str:
    """``raydiff train --single-process`` of the tiny UNet; its console."""
    # One level, fp32 and no validation: the fewest graphs to compile (the training step and
    # the end's previews), 2.5x less compiling than the two-level bf16 model with validation.
    settings = [
        *tiny_model(image_size=8),
        "model.channel_mult=1",
        "train.precision=fp32",
        "data.val_split=",
        "diffusion.diffusion_steps=40",
        "train.batch_size=8",
        "train.log_interval=2",
        "train.save_interval=2",
        "train.eval_num_images=4",
        "train.eval_timesteps=2",
        "train.sample_count=4",
        "train.sample_steps=2",
        f"train.compile={compile}",
    ]
    args = ["--data", str(data), "--output", str(out), "--max-steps", str(max_steps)]
    for setting in settings:
        args += ["--set", setting]
    done = subprocess.run(
        [sys.executable, "jobs/train.py", "--single-process", *args],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    console = done.stdout + done.stderr
    assert done.returncode == 0, console[-4000:]
    return console


def first_step_seconds(console: str, *, step: int) -> float:
    found = [(int(s), float(t)) for s, t in FIRST_STEP.findall(console)]
    assert [s for s, _ in found] == [step], console[-4000:]
    return found[0][1]


def test_a_resumed_compiled_run_starts_warm_and_trains_as_an_eager_run(
    prepared: Path, tmp_path: Path
) -> None:
    run = tmp_path / "compiled"
    cold = first_step_seconds(train(prepared, run, max_steps=2, compile="true"), step=1)
    cache = run / "compile_cache"
    assert (cache / "artifacts.bin").stat().st_size > 0
    assert list((cache / "inductor").rglob("*.so")), "no compiled kernels in the run folder"
    console = train(prepared, run, max_steps=4, compile="true")
    warm = first_step_seconds(console, step=3)
    print(f"first compiled step: cold {cold:.1f} s, after the restart {warm:.1f} s")
    assert "loaded the run's compiled artefacts (inductor: " in console
    # Measured 50 s cold and 4.0 s warm on a 2-core machine, lightly loaded (the one-level fp32
    # model; the two-level bf16 model with validation: 49-157 s cold, 2.2-5.0 s warm).
    assert warm < cold / 2, f"the restart compiled again: {warm:.1f} s against {cold:.1f} s"

    eager = tmp_path / "eager"
    train(prepared, eager, max_steps=4, compile="false")
    want = read_metrics(eager / "checkpoint_000004")
    got = read_metrics(run / "checkpoint_000004")
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-4)
    want_state = load_checkpoint(eager / "checkpoint_000004")
    got_state = load_checkpoint(run / "checkpoint_000004")
    assert got_state["model"].keys() == want_state["model"].keys()
    # Adam moves a weight by about lr a step whatever its gradient's size, so a gradient near 0
    # whose rounding differs may move it the other way: 2 lr apart a step, 4 steps.
    lr = want_state["config"]["optim"]["lr"]
    for key, value in want_state["model"].items():
        torch.testing.assert_close(got_state["model"][key], value, rtol=0, atol=4 * 2 * lr)


def test_an_inductor_compiled_sampler_draws_the_eager_samples() -> None:
    model = tiny_unet(channel_mult=(1,))  # one level: half the graph to compile
    diffusion = create_gaussian_diffusion(
        DiffusionConfig(diffusion_steps=100, timestep_respacing="ddim5")
    )

    def run(net: torch.nn.Module) -> np.ndarray:
        return generate(
            net, diffusion, indices=range(4), image_shape=(1, 8, 8), seed=3, use_ddim=True
        )

    try:
        got, want = run(compile_static(model)), run(model)
    finally:
        torch.compiler.reset()
    difference = np.abs(got.astype(int) - want.astype(int))
    assert difference.max() <= 1 and (difference == 0).mean() > 0.99
