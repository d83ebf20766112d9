"""Complete training checkpoints, one directory each, written atomically (``checkpoint_NNNNNN/``:
``model.pt``, ``ema_<rate>.pt``, ``trainer.pt``, ``config.json``, ``metrics.json``,
``progress.json`` and, written last, ``files.json``; docs/training.md, "What a run writes").

A checkpoint is complete when ``files.json`` is there and every file it lists has its size.
That is what makes a copy safe to resume from even when the copy is not atomic: Ray Train
copies a reported checkpoint into run storage file by file, in no fixed order, straight into
the final ``checkpoint_NNNNNN`` folder, so a crash mid-copy leaves a partial folder. Resuming
from "the newest checkpoint" therefore means the newest *complete* one (:func:`latest_checkpoint`
skips the others with a warning). The single-process loop also writes into a temporary sibling
directory and renames it into place. Files are loaded with ``torch.load(weights_only=True)``:
no pickled code runs on load.

Run folders and checkpoints may also be URIs (``raydiff.storage.StoragePath``): the functions
that read metadata (:func:`latest_checkpoint`, :func:`read_progress`, ...) read them in place;
:func:`load_checkpoint` takes a local folder (``raydiff.storage.local_copy`` downloads one).
On an object store there is no rename: :func:`save_checkpoint` uploads the files with
``files.json`` last, and the same completeness rule tells a partial upload.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydiff.errors import UserInputError
from raydiff.storage import StoragePath, as_location, local_path, upload

if TYPE_CHECKING:
    import torch

CHECKPOINT_PATTERN = re.compile(r"^checkpoint_(\d+)$")
PROGRESS_FILE = "progress.json"
FILES_FILE = "files.json"
METRICS_FILE = "metrics.json"
#: RankOptimizer-state entries copied to progress.json: optimiser steps taken, the data epoch and how
#: many (global) samples of that epoch were consumed.
PROGRESS_KEYS = ("step", "epoch", "epoch_samples")


logger = logging.getLogger(__name__)


def checkpoint_name(step: int) -> str:
    return f"checkpoint_{step:06d}"


def write_checkpoint_files(
    directory: Path,
    *,
    model_state: dict[str, torch.Tensor],
    ema_states: dict[float, dict[str, torch.Tensor]],
    trainer_state: dict[str, Any],
    config: dict[str, Any],
    metrics: dict[str, Any] | None = None,
) -> None:
    """Write the checkpoint files into an existing (empty) ``directory``."""
    # torch is imported by the functions that need it: the folder logic is also used where torch
    # costs seconds for nothing (a run's Ray Train controller, a sweep trial's process).
    import torch

    torch.save(model_state, directory / "model.pt")
    for rate, state in ema_states.items():
        torch.save(state, directory / f"ema_{rate}.pt")
    torch.save(trainer_state, directory / "trainer.pt")
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    if metrics is not None:
        numbers = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
        (directory / METRICS_FILE).write_text(json.dumps(numbers, indent=2, sort_keys=True))
    progress = {k: int(trainer_state[k]) for k in PROGRESS_KEYS if k in trainer_state}
    (directory / PROGRESS_FILE).write_text(json.dumps(progress, indent=2, sort_keys=True))
    # Last: the list that tells a complete checkpoint (or copy of one) from a partial one.
    sizes = {f.name: f.stat().st_size for f in sorted(directory.iterdir()) if f.is_file()}
    (directory / FILES_FILE).write_text(json.dumps(sizes, indent=2, sort_keys=True))


def incomplete_reason(directory: StoragePath) -> str | None:
    """Why ``directory`` is not a complete checkpoint (see the module docstring), or None."""
    directory = as_location(directory)
    listing = directory / FILES_FILE
    if not listing.is_file():
        return f"no {FILES_FILE} (a partial copy, or written by a raydiff before it existed)"
    try:
        sizes = json.loads(listing.read_text())
    except ValueError:
        return f"{FILES_FILE} is not valid JSON (a partial copy)"
    for name, size in sizes.items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, {FILES_FILE} says {size}"
    return None


def read_progress(directory: StoragePath) -> dict[str, int]:
    """``step``, ``epoch``, ``epoch_samples`` of a checkpoint, without loading any tensor.

    The driver uses it to start the data pipeline at the resumed epoch. Checkpoints written before
    ``progress.json`` existed give ``{}``.
    """
    path = as_location(directory) / PROGRESS_FILE
    if not path.is_file():
        return {}
    return {k: int(v) for k, v in json.loads(path.read_text()).items()}


def read_metrics(directory: StoragePath) -> dict[str, float]:
    """The metrics reported with a checkpoint ({} for one written before they were kept)."""
    path = as_location(directory) / METRICS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def save_checkpoint(root: StoragePath, step: int, **files: Any) -> StoragePath:
    """Atomically create ``root/checkpoint_{step}`` holding ``files`` (see write_checkpoint_files)."""
    local = local_path(root)
    if local is None:  # an object store: no rename, so an upload order
        return _upload_checkpoint(root, step, **files)
    local.mkdir(parents=True, exist_ok=True)
    final = local / checkpoint_name(step)
    # Temporaries of an earlier process that was killed mid-save (one writer per run folder).
    for stale in local.glob(".checkpoint_*.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=local))
    try:
        write_checkpoint_files(tmp, **files)
        for f in tmp.iterdir():  # make the bytes durable before the rename publishes them
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():  # the same step again: move the old one aside, then drop it
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-old-", dir=local))
            os.rename(final, old / final.name)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        fd = os.open(local, os.O_RDONLY)  # the rename itself survives a power cut
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _upload_checkpoint(root: StoragePath, step: int, **files: Any) -> StoragePath:
    """:func:`save_checkpoint` on an object store: ``files.json`` goes last (and an older one of
    the same step first), so until the upload is complete the checkpoint counts as partial."""
    final = root / checkpoint_name(step)
    with tempfile.TemporaryDirectory(prefix=f"{final.name}-") as tmp:
        write_checkpoint_files(Path(tmp), **files)
        (final / FILES_FILE).unlink(missing_ok=True)
        upload(Path(tmp), final, last=FILES_FILE)
    return final


def require_checkpoint_dir(directory: StoragePath) -> StoragePath:
    """``directory`` (a local path or a URI's) if it holds a raydiff checkpoint, else
    FileNotFoundError saying why."""
    directory = as_location(directory)
    if not (directory / "model.pt").is_file() or not (directory / "trainer.pt").is_file():
        raise FileNotFoundError(
            f"{directory} is not a raydiff checkpoint (needs model.pt and trainer.pt); "
            "give a checkpoint_NNNNNN directory"
        )
    # Checkpoints from before files.json existed are taken as they are when named explicitly.
    if (directory / FILES_FILE).is_file() and (reason := incomplete_reason(directory)):
        raise FileNotFoundError(f"{directory} is an incomplete checkpoint: {reason}")
    return directory


def load_checkpoint(directory: Path) -> dict[str, Any]:
    """Read a checkpoint directory: ``model``, ``ema`` {rate: state}, ``trainer``, ``config``."""
    import torch

    directory = require_checkpoint_dir(directory)
    ema = {}
    for f in sorted(directory.glob("ema_*.pt")):
        ema[float(f.stem.removeprefix("ema_"))] = torch.load(
            f, map_location="cpu", weights_only=True
        )
    return {
        "model": torch.load(directory / "model.pt", map_location="cpu", weights_only=True),
        "ema": ema,
        "trainer": torch.load(directory / "trainer.pt", map_location="cpu", weights_only=True),
        "config": json.loads((directory / "config.json").read_text()),
    }


def latest_checkpoint(root: StoragePath) -> StoragePath | None:
    """The complete checkpoint with the highest step under ``root``.

    Temporaries are ignored; partial folders (a copy cut short by a crash, see the module
    docstring) are skipped with a warning, so a run resumes from the newest complete checkpoint.
    """
    root = as_location(root)
    if not root.is_dir():
        return None
    found = sorted(
        ((int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT_PATTERN.match(p.name))),
        reverse=True,
    )
    for _, path in found:
        reason = incomplete_reason(path)
        if reason is None:
            return path
        hint = "" if (path / FILES_FILE).is_file() else "; --resume PATH takes it as it is"
        logger.warning("skipping %s: not a complete checkpoint (%s)%s", path, reason, hint)
    return None


def resume_point(output_dir: StoragePath, resume: StoragePath | None) -> StoragePath | None:
    """The checkpoint a run continues from: ``--resume`` when given, else the newest under
    ``output_dir`` (re-running a run continues it), else None (a fresh run)."""
    return as_location(resume) if resume is not None else latest_checkpoint(output_dir)


def load_model_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Load a model state dict file (raydiff or published improved-/guided-diffusion) strictly.

    A mismatch means the config's model flags differ from the ones the weights were trained with;
    the error lists the first differing keys and shapes.
    """
    import torch

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"train.init_checkpoint={str(path)!r} does not exist")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
        state = state["model"]
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [
        f"{k}: file {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in state and tuple(state[k].shape) != tuple(own[k].shape)
    ]
    if missing or unexpected or shapes:
        raise UserInputError(
            f"{path} does not match the configured model (set the model flags it was trained "
            f"with, e.g. num_channels, num_res_blocks, learn_sigma, class_cond, channel_mult): "
            f"missing {missing[:4]}, unexpected {unexpected[:4]}, shape mismatches {shapes[:4]}"
        )
    model.load_state_dict(state, strict=True)
