"""The GPU benchmarks' parts that run without a GPU: the clear exit (status 2) on a machine
without CUDA (bench/gpu_step.py's ``require_cuda``, which bench/sampling.py --gpu shares), the
models of the sampling modes, and a whole small run of raydiff's sampling modes on the CPU
(``--device cpu``; improved-diffusion's are left out: its checkout is not part of the
repository). Their options and modes run on a GPU in ``make gpu-check``."""

from __future__ import annotations

import json

import pytest
import torch
from bench_script import load_bench_script
from tiny_model import tiny_model, tiny_unet


@pytest.fixture(scope="module")
def bench():
    return load_bench_script("sampling_gpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_sampling_py_gpu_says_so_and_exits_with_status_2(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        load_bench_script("sampling").main(["--gpu", "--batch-size", "8"])
    assert exit_.value.code == 2
    assert "has none" in capsys.readouterr().err


def test_each_mode_gets_its_model_and_the_fp32_one_is_left_as_it_is(bench) -> None:
    model = tiny_unet(num_classes=3)
    models = {"raydiff": model}
    # Autocast modes sample through generate(precision=...): their model is the fp32 one.
    assert bench.mode_model(bench.MODES["raydiff-bf16"], models) is model
    assert bench.MODES["raydiff-bf16"].precision == "bf16"
    half = bench.mode_model(bench.MODES["raydiff-fp16-weights"], models)
    assert half is not model and next(half.input_blocks.parameters()).dtype == torch.float16
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert bench.mode_model(bench.MODES["raydiff-fp32"], models) is model


def test_a_small_run_of_raydiffs_modes_on_the_cpu_writes_every_case_and_mode(
    bench, tmp_path, capsys
) -> None:
    out = tmp_path / "sampling.json"
    sets = [arg for override in tiny_model(image_size=8) for arg in ("--set", override)]
    bench.main(
        [
            *("--device", "cpu", "--no-reference", "--modes", "raydiff-fp32,raydiff-bf16"),
            *("--batch-size", "2", "--ddim-steps", "2", "--ancestral-steps", "4"),
            *("--ddim-batches", "2", "--out", str(out), *sets),
        ]
    )
    result = json.loads(out.read_text())
    rows = {(r["case"], r["mode"]): r for r in result["rows"]}
    assert set(rows) == {
        (case, mode)
        for case in ("ddim-2", "ancestral-4")
        for mode in ("raydiff-fp32", "raydiff-bf16")
    }
    assert all(r["samples_per_s"] > 0 and r["vs_ref-fp16"] is None for r in rows.values())
    assert len(result["batch_times_s"]["raydiff-fp32"]["ddim-2"]) == 2
    assert rows["ddim-2", "raydiff-fp32"]["first_batch_s"] is not None
    assert rows["ancestral-4", "raydiff-fp32"]["first_batch_s"] is None
    assert result["fp32_max_abs_difference"] is None  # no reference model to compare with
    assert "ancestral-4     raydiff-bf16" in capsys.readouterr().out
