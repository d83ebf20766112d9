"""``torch.compile`` for the training step, and the compiled artefacts kept with the run.

The step calls a compiled module (``train.compile``); checkpoints, EMA and the weight
fingerprints use the uncompiled one, whose parameters are the same tensors: state-dict keys stay
those of the module (no ``_orig_mod.`` prefix) and EMA tracks the trained weights. Validation
and previews call the uncompiled module compiled for inference (:func:`compile_static`),
into which the loop swaps the EMA weights.

Compiling a UNet takes minutes, and an elastic resize, a preemption or a resume restarts every
worker process, so the artefacts live in the run folder (``compile_cache/``): PyTorch's portable
cache ``artifacts.bin`` (written by the main rank, loaded by every rank; an object store's run
folder too) and, for a local run folder, inductor's own cache folder ``inductor/``, which alone
holds a CPU's compiled C++ kernels (docs/training.md, "Compiled training (`train.compile`)").
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Protocol

import torch

from raydiff.storage import StoragePath, local_path, write_bytes_atomically
from raydiff.train.precision import PrecisionPolicy, autocast_model

logger = logging.getLogger(__name__)

CACHE_FOLDER = "compile_cache"
ARTIFACTS_FILE = "artifacts.bin"
INDUCTOR_FOLDER = "inductor"
INDUCTOR_CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"


def compile_static(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` compiled with every shape static (``dynamic=False``): one graph per shape,
    instead of a slower dynamic-shape graph for all (a run's shapes are fixed; an elastic resize
    compiles once more). Used for the training step, DDP wrapped first, as PyTorch's DDP notes
    ask, so dynamo splits the graph at DDP's gradient buckets and each bucket's all-reduce
    overlaps the rest of the backward pass; and for inference (``raydiff sample --compile``, a
    compiled run's validation and previews), where every batch of one size runs the same
    kernels, so a sample still depends on (seed, index) alone. The compiled module calls
    ``model``'s parameters: the EMA weights swapped into them compile nothing new.
    """
    return torch.compile(model, dynamic=False)


class CompileCache:
    """The compiled artefacts of the run in ``run_dir`` (module docstring)."""

    def __init__(self, run_dir: StoragePath, *, is_main: bool) -> None:
        self.folder = run_dir / CACHE_FOLDER
        self.is_main = is_main
        self.artifacts = self.folder / ARTIFACTS_FILE
        self.held: dict[str, list[str]] = {}  # the artefacts' keys in the run folder, by kind

    @contextlib.contextmanager
    def inductor_folder(self) -> Iterator[None]:
        """Inductor's cache folder in the run folder while the block runs (a local run folder
        only: inductor needs an OS path); the previous setting back afterwards."""
        local = local_path(self.folder)
        if local is None:
            yield
            return
        before = os.environ.get(INDUCTOR_CACHE_VARIABLE)
        # Inductor reads the variable whenever it looks up its cache, so setting it before the
        # first compiled step is enough.
        os.environ[INDUCTOR_CACHE_VARIABLE] = str(local / INDUCTOR_FOLDER)
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(INDUCTOR_CACHE_VARIABLE, None)
            else:
                os.environ[INDUCTOR_CACHE_VARIABLE] = before

    def load(self) -> dict[str, int]:
        """Load the run's portable artefacts (every rank, before the first compiled step);
        returns how many of each kind were loaded (empty: none saved yet)."""
        if not self.artifacts.is_file():
            return {}
        info = torch.compiler.load_cache_artifacts(self.artifacts.read_bytes())
        self.held = artifact_keys(info)
        counts = {kind: len(keys) for kind, keys in self.held.items()}
        logger.info(
            "loaded the run's compiled artefacts (%s) from %s",
            ", ".join(f"{kind}: {n}" for kind, n in counts.items()) or "none",
            self.artifacts,
        )
        return counts

    def save(self) -> bool:
        """Write what this process has compiled (the main rank, after its first compiled step);
        False when there was nothing new to write."""
        if not self.is_main:
            return False
        saved = torch.compiler.save_cache_artifacts()
        # A warm start saves what it loaded again (in other bytes): nothing to write then.
        if saved is None or artifact_keys(saved[1]) == self.held:
            return False
        data, info = saved
        self.folder.mkdir(parents=True, exist_ok=True)
        write_bytes_atomically(self.artifacts, data)
        self.held = artifact_keys(info)
        logger.info(
            "saved the compiled artefacts (%s, %.1f MB) to %s",
            ", ".join(f"{kind}: {len(keys)}" for kind, keys in info.artifacts.items()),
            len(data) / 1e6,
            self.artifacts,
        )
        return True


def artifact_keys(info: torch.compiler.CacheInfo | None) -> dict[str, list[str]]:
    """The keys of the artefacts ``info`` names, by kind (sorted: comparable)."""
    return {kind: sorted(keys) for kind, keys in (info.artifacts if info else {}).items() if keys}


class CompiledTrainer(Protocol):
    """What :class:`LoopCompilation` reads of a rank's trainer (``RankOptimizer``)."""

    compiled: bool
    raw_model: torch.nn.Module
    device: torch.device
    precision: PrecisionPolicy


class LoopCompilation:
    """What a compiled run's loop does about compiling, one call per event (an eager run's
    calls do nothing): the artefacts loaded before the first step (:meth:`in_use`), saved after
    the first step, validation and preview (:meth:`after_step`, :meth:`model_for`), so that a
    restart or a resume loads them instead of compiling again; the module evaluations call.

    :param trainer: the rank's trainer: whether its step is compiled, its raw (uncompiled)
        model, into which the loop swaps the evaluation weights, its resolved precision.
    """

    def __init__(self, trainer: CompiledTrainer, *, run_dir: StoragePath, is_main: bool) -> None:
        self.raw_model, self.device = trainer.raw_model, trainer.device
        self.cache = CompileCache(run_dir, is_main=is_main) if trainer.compiled else None
        self.precision = trainer.precision.precision
        self.inference_model: torch.nn.Module | None = None  # made by the first evaluation
        self.saved_after: set[str] = set()  # the events whose graphs the cache holds

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """The block that trains: inductor's folder in the run folder, the run's artefacts loaded
        before it starts."""
        if self.cache is None:
            yield
            return
        with self.cache.inductor_folder():
            self.cache.load()
            yield

    def after_step(self, *, step: int, seconds: float) -> None:
        """After this process's first compiled step: how long it took, and save what it compiled."""
        if self.cache is not None and "step" not in self.saved_after:
            logger.info(
                "step %d, this process's first, took %.1f s (compiling, or loading what the run "
                "compiled before)",
                step,
                seconds,
            )
            self.save_after("step")

    @contextlib.contextmanager
    def model_for(self, what: str) -> Iterator[torch.nn.Module]:
        """The module a ``"validation"`` or ``"preview"`` calls: the raw model, or with a compiled
        step a compiled view of it, made once per run (its parameters are the raw model's: a
        swap of weights compiles nothing new), whose previews also autocast the forward in the
        step's precision, as ``raydiff sample --precision`` does (the sampler's own arithmetic
        stays fp32; an eager run's previews stay fp32)."""
        if self.cache is None:
            yield self.raw_model
            return
        if self.inference_model is None:
            self.inference_model = compile_static(self.raw_model)
        model = self.inference_model
        yield (
            autocast_model(model, self.precision, device=self.device)
            if what == "preview"
            else model
        )
        self.save_after(what)

    def save_after(self, what: str) -> None:
        """After a compiled run's first ``what`` (step, preview, validation): what it compiled
        joins the run's artefacts (the main rank saves them)."""
        if self.cache is not None and what not in self.saved_after:
            self.saved_after.add(what)
            self.cache.save()
