"""bench/gpu_step.py's parts that run without a GPU: its options, the config of every mode of
both presets, and the clear exit (status 2) on a machine without CUDA."""

from __future__ import annotations

import pytest
import torch
from bench_script import load_bench_script


@pytest.fixture(scope="module")
def bench():
    return load_bench_script("gpu_step")


def test_every_mode_of_both_presets_has_its_config(bench) -> None:
    args = bench.parse_args([])
    assert args.presets == ("cifar10_hybrid", "imagenet64_cond") and "ref-fp16" in args.modes
    for preset in args.presets:
        for mode in args.modes:
            config = bench.mode_config(preset, mode, batch=bench.DEFAULT_BATCH[preset])
            assert config.train.precision == ("bf16" if "-bf16" in mode else "fp16")
            assert config.train.compile == ("true" if "-compile" in mode else "false")
            assert config.scaling.use_gpu


def test_unknown_modes_are_refused_by_name(bench, capsys) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--modes", "raydiff-bf16,raydiff-tf32"])
    assert "raydiff-tf32 unknown" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_it_says_so_and_exits_with_status_2(bench, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--presets", "cifar10_hybrid"])
    assert exit_.value.code == 2
    assert "has none" in capsys.readouterr().err
