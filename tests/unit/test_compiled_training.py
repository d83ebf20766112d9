"""``train.compile``: the config field, the compiled step against the eager one, one compile per
run, and what a compiled run saves.

Compiling with inductor takes a minute or more on a 2-core CPU, so these tests compile with a
backend that counts the graphs dynamo hands it and runs them as traced (``torch.compile``'s
documented ``backend=`` callable, forced with the public ``torch.compiler.set_stance(...,
force_backend=...)``). That exercises everything raydiff adds around ``torch.compile`` (the
compiled module in the step, microbatches, gradient clipping, the
loss-aware sampler, the uncompiled module in checkpoints and EMA) and counts recompiles exactly:
dynamo calls the backend once per graph it compiles, and a guard that fails on a later step
compiles again. Inductor's numerics are tests/e2e/test_compile.py's (fp32) and tests/gpu's
(fp16 and bf16 on CUDA); bench/compile_step.py prints them for bf16 on a CPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from tiny_model import tiny_batches, tiny_model, tiny_rank_optimizer
from torch.compiler import CacheInfo

from raydiff.config import (
    ExperimentConfig,
    TrainConfig,
    apply_overrides,
    compile_wanted,
    from_dict,
    to_dict,
)
from raydiff.errors import ConfigError
from raydiff.factory import create_model
from raydiff.storage import as_location
from raydiff.train.checkpoint import latest_checkpoint, load_checkpoint
from raydiff.train.compilation import INDUCTOR_CACHE_VARIABLE, CompileCache
from raydiff.train.local import LocalRuntime
from raydiff.train.loop import run_loop
from raydiff.train.precision import AutocastModel
from raydiff.train.tasks import task_of_config

BATCH, STEPS = 8, 5


class CountingBackend:
    """A ``torch.compile`` backend that counts the graphs it is given and runs them as traced."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list) -> object:
        self.graphs += 1
        return graph.forward


@pytest.fixture
def counting() -> Iterator[CountingBackend]:
    backend = CountingBackend()
    with torch.compiler.set_stance("default", force_backend=backend):
        yield backend
    torch.compiler.reset()  # drop the graphs compiled for this test's modules


def config(*overrides: str) -> ExperimentConfig:
    return apply_overrides(
        ExperimentConfig(),
        [
            *tiny_model(image_size=8),
            "diffusion.diffusion_steps=4",
            "diffusion.noise_schedule=cosine",
            "train.eval_timesteps=2",
            *overrides,
        ],
    )


def test_train_compile_takes_auto_true_or_false_and_auto_means_cuda() -> None:
    assert TrainConfig().compile == "auto"
    assert config("train.compile=true").train.compile == "true"
    assert config("train.compile=False").train.compile == "false"
    # YAML reads true/false as booleans; a saved config reads back as it was written.
    assert from_dict(TrainConfig, {"compile": True}).compile == "true"
    assert from_dict(TrainConfig, to_dict(TrainConfig(compile="false"))).compile == "false"
    with pytest.raises(ConfigError, match=r"train\.compile.*'fast'.*auto, true, false"):
        TrainConfig(compile="fast")  # type: ignore[arg-type]
    assert [compile_wanted("auto", cuda=c) for c in (True, False)] == [True, False]
    assert [compile_wanted("true", cuda=c) for c in (True, False)] == [True, True]
    assert [compile_wanted("false", cuda=c) for c in (True, False)] == [False, False]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_compiled_step_trains_as_the_eager_step_and_compiles_once(
    counting: CountingBackend, precision: str
) -> None:
    eager = tiny_rank_optimizer(compiled=False, precision=precision)
    compiled = tiny_rank_optimizer(compiled=True, precision=precision)
    assert compiled.model is not compiled.raw_model
    graphs_after = []
    for batch in tiny_batches(STEPS):
        want, got = eager.optimize(batch), compiled.optimize(batch)
        graphs_after.append(counting.graphs)
        torch.testing.assert_close(got.losses, want.losses)
        torch.testing.assert_close(got.grad_norm, want.grad_norm)
        torch.testing.assert_close(got.weights, want.weights)
    assert graphs_after[0] > 0, "the step did not run the compiled module"
    # The second microbatch of step 1 and every later step reuse the graphs of the first.
    assert graphs_after == graphs_after[:1] * STEPS, f"graphs compiled by step: {graphs_after}"
    assert float(want.weights.std()) > 0, "the loss-aware sampler did not weigh the last step"
    assert eager.optim_config.grad_clip < float(want.grad_norm), "clipping did not act"
    for (name, p_eager), p_compiled in zip(
        eager.raw_model.named_parameters(), compiled.raw_model.parameters(), strict=True
    ):
        torch.testing.assert_close(p_compiled, p_eager, msg=name)
    assert compiled.eval_weights().keys() == compiled.raw_model.state_dict().keys()


def test_a_compiled_ddp_module_trains_as_the_eager_one_without_recompiling(
    counting: CountingBackend,
) -> None:
    """On several workers the step calls the DDP wrapper compiled (DDP first: dynamo's
    DDPOptimizer splits the graph at the gradient buckets), through DDP's no_sync for the first
    microbatch. A one-rank gloo group: DDP's code path, without a second process."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        eager = tiny_rank_optimizer(compiled=False, ddp=True)
        compiled = tiny_rank_optimizer(compiled=True, ddp=True)
        assert hasattr(compiled.model, "no_sync")  # the compiled wrapper passes DDP's on
        graphs_after = []
        for batch in tiny_batches(3):
            want, got = eager.optimize(batch), compiled.optimize(batch)
            graphs_after.append(counting.graphs)
            torch.testing.assert_close(got.losses, want.losses)
            torch.testing.assert_close(got.grad_norm, want.grad_norm)
    finally:
        dist.destroy_process_group()
    assert graphs_after[0] > 0 and graphs_after == graphs_after[:1] * 3, graphs_after
    assert compiled.eval_weights().keys() == compiled.raw_model.state_dict().keys()


def test_a_compiled_run_saves_the_modules_keys_and_restores_the_inductor_setting(
    tmp_path: Path, counting: CountingBackend
) -> None:
    before = os.environ.get(INDUCTOR_CACHE_VARIABLE)
    cfg = config(
        "train.compile=true",
        f"train.batch_size={BATCH}",
        "train.max_steps=3",
        "train.save_interval=3",
        "train.log_interval=3",
        "train.sample_count=4",
        "train.sample_steps=2",
        "optim.ema_rate=0.5",
    )
    images = torch.rand(16, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    runtime = LocalRuntime(cfg, output_dir=tmp_path, resume=None, images=images, labels=None)
    run_loop(cfg, runtime=runtime, output_dir=tmp_path)
    assert counting.graphs > 0
    state = load_checkpoint(latest_checkpoint(tmp_path))
    keys = create_model(cfg.model, learn_sigma=cfg.diffusion.learn_sigma).state_dict().keys()
    assert state["model"].keys() == keys  # no "_orig_mod." prefix
    assert state["ema"][0.5].keys() == keys
    assert not torch.equal(state["ema"][0.5]["out.2.weight"], state["model"]["out.2.weight"])
    assert os.environ.get(INDUCTOR_CACHE_VARIABLE) == before
    # A backend that is not inductor leaves no portable artefacts to save.
    assert not (tmp_path / "compile_cache" / "artifacts.bin").exists()


def test_the_compile_cache_of_a_run_on_object_storage(monkeypatch: pytest.MonkeyPatch) -> None:
    """The portable artefacts go through the storage layer (a mock:// URI here): the main rank
    writes them, every rank loads them; inductor's folder stays where it was (no OS path)."""
    loaded: list[bytes] = []
    saved = (b"artefacts", CacheInfo())
    saved[1].artifacts["inductor"].append("key")
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: saved)
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: loaded.append(data))
    run = as_location("mock:///bucket/runs/compiled")
    worker, main = CompileCache(run, is_main=False), CompileCache(run, is_main=True)
    before = os.environ.get(INDUCTOR_CACHE_VARIABLE)
    with main.inductor_folder():
        assert os.environ.get(INDUCTOR_CACHE_VARIABLE) == before
        assert worker.load() == {} and loaded == []  # nothing saved yet
        assert not worker.save()
        assert main.save()
        assert not main.save()  # nothing new
    assert (run / "compile_cache" / "artifacts.bin").read_bytes() == b"artefacts"
    CompileCache(run, is_main=False).load()
    assert loaded == [b"artefacts"]


@pytest.mark.parametrize("before", [None, "/elsewhere"])
def test_a_local_run_folder_holds_inductors_cache_while_it_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: str | None
) -> None:
    if before is None:
        monkeypatch.delenv(INDUCTOR_CACHE_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(INDUCTOR_CACHE_VARIABLE, before)
    with CompileCache(tmp_path, is_main=True).inductor_folder():
        assert os.environ[INDUCTOR_CACHE_VARIABLE] == str(tmp_path / "compile_cache" / "inductor")
    assert os.environ.get(INDUCTOR_CACHE_VARIABLE) == before


class EvaluationSpy:
    """A run's task that records, for each preview and validation, the module it was given,
    whether autocast was on, and the graphs compiled before and after it."""

    def __init__(self, task: Any, counting: CountingBackend) -> None:
        self.task, self.counting = task, counting
        self.calls: dict[str, list[tuple[torch.nn.Module, bool, int, int]]] = {
            "preview": [],
            "evaluate": [],
        }

    def __getattr__(self, name: str) -> Any:
        return getattr(self.task, name)

    def record(self, kind: str, model: torch.nn.Module, call: Any) -> Any:
        before, autocast = self.counting.graphs, torch.is_autocast_enabled("cpu")
        result = call()
        self.calls[kind].append((model, autocast, before, self.counting.graphs))
        return result

    def preview(self, model: torch.nn.Module, *, seed: int) -> Any:
        return self.record("preview", model, lambda: self.task.preview(model, seed=seed))

    def evaluate(self, model: torch.nn.Module, batches: Any, *, seed: int) -> Any:
        return self.record("evaluate", model, lambda: self.task.evaluate(model, batches, seed=seed))


def run_spied(tmp_path: Path, counting: CountingBackend, *overrides: str) -> EvaluationSpy:
    """A 3-step bf16 run of the tiny model that previews and validates at every step."""
    cfg = config(
        "train.precision=bf16",
        f"train.batch_size={BATCH}",
        "train.max_steps=3",
        "train.sample_interval=1",
        "train.eval_interval=1",
        "train.log_interval=3",
        "train.save_interval=3",
        "train.sample_count=4",
        "train.sample_steps=2",
        "train.eval_num_images=12",
        "optim.ema_rate=0.5",
        *overrides,
    )
    g = torch.Generator().manual_seed(0)
    images = torch.rand(16, 1, 8, 8, generator=g) * 2 - 1
    val = (torch.rand(12, 1, 8, 8, generator=g) * 2 - 1, None)
    runtime = LocalRuntime(
        cfg, output_dir=tmp_path, resume=None, images=images, labels=None, val=val
    )
    spies: list[EvaluationSpy] = []

    def make_task(config: ExperimentConfig, *, runtime: Any) -> Any:
        spies.append(EvaluationSpy(task_of_config(config, runtime=runtime), counting))
        return spies[-1]

    run_loop(cfg, runtime=runtime, output_dir=tmp_path, make_task=make_task)
    return spies[0]


def test_a_compiled_runs_previews_and_validation_compile_once_previews_in_its_precision(
    tmp_path: Path, counting: CountingBackend
) -> None:
    """The EMA weights swapped in at each evaluation are parameters of the compiled view, so
    the second and third previews (and validations) compile nothing; previews autocast in
    train.precision, validation stays fp32."""
    spy = run_spied(tmp_path, counting, "train.compile=true")
    for kind, calls in spy.calls.items():
        assert len(calls) == 3, kind
        graphs = [(before, after) for _, _, before, after in calls]
        assert graphs[0][1] > graphs[0][0], f"the first {kind} ran no compiled module"
        assert all(after == before for before, after in graphs[1:]), f"{kind}: {graphs}"
    previews = [model for model, _, _, _ in spy.calls["preview"]]
    assert all(isinstance(m, AutocastModel) and m.dtype == torch.bfloat16 for m in previews)
    evaluated = [model for model, _, _, _ in spy.calls["evaluate"]]
    assert all(m is evaluated[0] and m is not spy.task.model for m in evaluated)
    assert previews[0].model is evaluated[0]  # one compiled view of the raw model
    assert not any(autocast for _, autocast, _, _ in spy.calls["evaluate"])


def test_an_eager_run_previews_and_validates_the_raw_model_in_fp32(
    tmp_path: Path, counting: CountingBackend
) -> None:
    spy = run_spied(tmp_path, counting, "train.compile=false")
    calls = spy.calls["preview"] + spy.calls["evaluate"]
    assert len(calls) == 6 and counting.graphs == 0
    assert all(model is spy.task.model and not autocast for model, autocast, _, _ in calls)
