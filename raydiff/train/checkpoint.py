"""Complete training checkpoints, one directory each, written atomically.

Layout of ``checkpoint_000500/``::

    model.pt              model state dict (loads into UNetModel; improved-diffusion compatible)
    ema_0.9999.pt         one model-format state dict per EMA rate
    trainer.pt            optimiser, grad scaler, timestep sampler (incl. loss history), step,
                          skipped steps, data position, RNG states
    config.json           the full resolved config
    progress.json         step and data position (epoch, samples into it), readable without torch

Everything is written into a temporary sibling directory and renamed into place, so a crash never
leaves a half-written checkpoint that a resume could pick up. Files are loaded with
``torch.load(weights_only=True)``: no pickled code runs on load.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_PATTERN = re.compile(r"^checkpoint_(\d+)$")
PROGRESS_FILE = "progress.json"
#: Trainer-state entries copied to progress.json: optimiser steps taken, the data epoch and how
#: many (global) samples of that epoch were consumed.
PROGRESS_KEYS = ("step", "epoch", "epoch_samples")


def checkpoint_name(step: int) -> str:
    return f"checkpoint_{step:06d}"


def write_checkpoint_files(
    directory: Path,
    *,
    model_state: dict[str, torch.Tensor],
    ema_states: dict[float, dict[str, torch.Tensor]],
    trainer_state: dict[str, Any],
    config: dict[str, Any],
) -> None:
    """Write the checkpoint files into an existing (empty) ``directory``."""
    torch.save(model_state, directory / "model.pt")
    for rate, state in ema_states.items():
        torch.save(state, directory / f"ema_{rate}.pt")
    torch.save(trainer_state, directory / "trainer.pt")
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    progress = {k: int(trainer_state[k]) for k in PROGRESS_KEYS if k in trainer_state}
    (directory / PROGRESS_FILE).write_text(json.dumps(progress, indent=2, sort_keys=True))


def read_progress(directory: Path) -> dict[str, int]:
    """``step``, ``epoch``, ``epoch_samples`` of a checkpoint, without loading any tensor.

    The driver uses it to start the data pipeline at the resumed epoch. Checkpoints written before
    ``progress.json`` existed give ``{}``.
    """
    path = Path(directory) / PROGRESS_FILE
    if not path.is_file():
        return {}
    return {k: int(v) for k, v in json.loads(path.read_text()).items()}


def save_checkpoint(root: Path, step: int, **files: Any) -> Path:
    """Atomically create ``root/checkpoint_{step}`` holding ``files`` (see write_checkpoint_files)."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(step)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
    try:
        write_checkpoint_files(tmp, **files)
        for f in tmp.iterdir():  # make the bytes durable before the rename publishes them
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def require_checkpoint_dir(directory: Path) -> Path:
    """``directory`` as a Path if it holds a raydiff checkpoint, else FileNotFoundError saying why."""
    directory = Path(directory)
    if not (directory / "model.pt").is_file() or not (directory / "trainer.pt").is_file():
        raise FileNotFoundError(
            f"{directory} is not a raydiff checkpoint (needs model.pt and trainer.pt); "
            "give a checkpoint_NNNNNN directory"
        )
    return directory


def load_checkpoint(directory: Path) -> dict[str, Any]:
    """Read a checkpoint directory: ``model``, ``ema`` {rate: state}, ``trainer``, ``config``."""
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


def latest_checkpoint(root: Path) -> Path | None:
    """The completed checkpoint with the highest step under ``root`` (temporaries ignored)."""
    if not root.is_dir():
        return None
    found = [
        (int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT_PATTERN.match(p.name))
    ]
    return max(found)[1] if found else None


def resume_point(output_dir: Path, resume: Path | None) -> Path | None:
    """The checkpoint a run continues from: ``--resume`` when given, else the newest under
    ``output_dir`` (re-running a run continues it), else None (a fresh run)."""
    return Path(resume) if resume is not None else latest_checkpoint(Path(output_dir))


def load_model_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Load a model state dict file (raydiff or published improved-/guided-diffusion) strictly.

    A mismatch means the config's model flags differ from the ones the weights were trained with;
    the error lists the first differing keys and shapes.
    """
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
        raise ValueError(
            f"{path} does not match the configured model (set the model flags it was trained "
            f"with, e.g. num_channels, num_res_blocks, learn_sigma, class_cond, channel_mult): "
            f"missing {missing[:4]}, unexpected {unexpected[:4]}, shape mismatches {shapes[:4]}"
        )
    model.load_state_dict(state, strict=True)
