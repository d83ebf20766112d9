"""``raydiff ema``: EMA weights of any length, reconstructed after training from a run's post-hoc
EMA snapshots (EDM2, Karras et al. 2024, sec. 3 and algorithm 3; the files and their use:
docs/posthoc_ema.md). No Ray here.

The weights of a target profile are the least-squares combination of every snapshot up to its
step (:func:`raydiff.train.posthoc_ema.reconstruction_coefficients`). Snapshots are read one at
a time, so memory holds one snapshot and the targets.
"""

from __future__ import annotations

import io
import json
import logging
import re
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from raydiff.errors import ConfigError, UserInputError
from raydiff.evaluate.options import BpdOptions, FidOptions
from raydiff.flags import flag, included
from raydiff.sample.options import SampleOptions
from raydiff.storage import StoragePath, as_location, write_bytes_atomically
from raydiff.train.checkpoint import checkpoint_name, latest_checkpoint
from raydiff.train.posthoc_ema import (
    RECONSTRUCTION_ERROR_LIMIT,
    WeightedSum,
    profile_key,
    rate_to_sigma_rel,
    reconstruction_coefficients,
    reconstruction_error,
)
from raydiff.train.run_files import POSTHOC_DIR

logger = logging.getLogger(__name__)

SNAPSHOT_PATTERN = re.compile(r"^snapshot_(\d+)\.pt$")

DIFFUSION = "--evaluate, diffusion models"
"""When the sampling and FD options apply (a classifier's sweep runs its validation)."""

SIGMA_REL_GRID = np.round(np.arange(0.005, 0.2951, 0.005), 3)
"""The lengths a refusal checks to say which ones the snapshots do represent."""


def parse_lengths(text: str) -> tuple[float, ...]:
    """``0.03,0.08`` or ``START:STOP:N`` (N lengths from START to STOP, both included)."""
    try:
        if ":" in text:
            start, stop, count = text.split(":")
            return tuple(float(v) for v in np.linspace(float(start), float(stop), int(count)))
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError("expected lengths like '0.05,0.10' or 'START:STOP:N'") from None


def parse_rates(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError("expected rates like '0.9999,0.999'") from None


@dataclass(kw_only=True)
class EmaOptions:
    """What ``raydiff ema`` is asked for (validated on construction)."""

    section: ClassVar[str] = "ema"
    """What a ``ConfigError`` of these options names as its section."""

    config: str | None = flag(
        "--config",
        default=None,
        help="a YAML file of these options by name (run: RUN, sigma_rel: 0.03:0.2:8, evaluate: "
        "true, ...); flags typed beside it win",
    )
    run: str = flag(
        "--run", default="", help="a run folder trained with optim.posthoc_ema_stds (or a URI)"
    )
    sigma_rel: tuple[float, ...] = flag(
        "--sigma-rel",
        default=(),
        from_arg=parse_lengths,
        arg_default="",
        help="EMA lengths (relative standard deviations) to reconstruct: '0.03,0.08,0.15' or "
        "'START:STOP:N'",
    )
    rate: tuple[float, ...] = flag(
        "--rate",
        default=(),
        from_arg=parse_rates,
        arg_default="",
        help="or improved-diffusion-style EMA rates (decay per step), each taken as the length "
        "it has at --step",
    )
    step: int = flag(
        "--step", default=0, help="the checkpoint step to write them to (0: the newest checkpoint)"
    )
    evaluate: bool = flag(
        "--evaluate",
        default=False,
        help="then evaluate every length and the checkpoint's fixed-rate EMAs on Ray actors, and "
        "write a table, CSV and plot ranking them (see docs/posthoc_ema.md)",
    )
    # What --evaluate measures: raydiff sample's samples, raydiff evaluate fid's FD in an
    # evaluator's features, raydiff evaluate bpd's bits/dim; their options, included.
    features: str | None = included(FidOptions, "features", context=DIFFUSION)
    inception: str | None = included(
        FidOptions,
        "inception",
        context=DIFFUSION,
        help="or the FID Inception weights file (one of --features / --inception is needed)",
    )
    num_samples: int = included(
        SampleOptions,
        "num_samples",
        context=DIFFUSION,
        default=0,
        help="samples per weights (the same seed for every one)",
    )
    num_images: int = included(
        BpdOptions,
        "num_images",
        context="--evaluate",
        default=64,
        help="the val images of each weights' bits/dim or accuracy (default: %(default)s)",
    )
    num_workers: int = included(
        BpdOptions, "num_workers", context="--evaluate", help="Ray actors (default: %(default)s)"
    )
    timestep_respacing: str = included(
        SampleOptions,
        "timestep_respacing",
        context="--evaluate",
        default="ddim25",
        help="the sampling steps, e.g. 'ddim25', '250' (default: %(default)s)",
    )
    use_ddim: bool = included(
        SampleOptions,
        "use_ddim",
        context="--evaluate",
        default=True,
        help="DDIM instead of ancestral sampling (default: on)",
    )
    bpd_respacing: str = included(
        BpdOptions, "timestep_respacing", context="--evaluate", name="--bpd-respacing"
    )
    seed: int = included(
        BpdOptions,
        "seed",
        context="--evaluate",
        help="the seed of every weights' samples and noise",
    )
    out: str | None = flag(
        "--out",
        default=None,
        help="--evaluate: the sweep's folder, new or empty (default: "
        "RUN/posthoc_ema/sweep_NNNNNNN, the checkpoint's step); a path or a URI",
    )

    def __post_init__(self) -> None:
        if not self.run:
            reason = "give --run RUN, the run folder to reconstruct from (or run: in --config)"
            raise self._refused("run", "", reason)
        if not self.sigma_rel and not self.rate:
            raise self._refused(
                "sigma_rel", "", "give --sigma-rel LENGTHS (e.g. 0.05,0.10) or --rate RATES"
            )
        for value in self.sigma_rel:
            if not 0 < value < 0.3:
                reason = "a length is a relative standard deviation in (0, 0.3)"
                raise self._refused("sigma_rel", value, reason)
        for value in self.rate:
            if not 0 < value < 1:
                raise self._refused("rate", value, "must lie in (0, 1)")
        # The --evaluate options: in range, and given only with it. Whether the run's task needs
        # --num-samples and an evaluator is checked once its config is read.
        lows = (("step", 0), ("num_samples", 0), ("num_images", 1), ("num_workers", 1), ("seed", 0))
        for name, low in lows:
            if getattr(self, name) < low:
                raise self._refused(name, getattr(self, name), f"must be >= {low}")
        if self.features and self.inception:
            reason = "measures in a classifier's features: drop --inception"
            raise self._refused("features", self.features, reason)
        given = self.given("features", "inception", "num_samples", "out")
        if given and not self.evaluate:
            raise UserInputError(f"{' / '.join(given)} apply to a sweep: add --evaluate")

    def given(self, *names: str) -> list[str]:
        """The flags of the fields ``names`` that were given."""
        return [f"--{name.replace('_', '-')}" for name in names if getattr(self, name)]

    def _refused(self, name: str, value: object, reason: str) -> ConfigError:
        return ConfigError(section=self.section, field=name, value=value, reason=reason)


@dataclass(frozen=True)
class Reconstructed:
    """One written length: its name (``phema_0.080``), length, where, and its fit."""

    name: str
    sigma_rel: float
    path: StoragePath
    error: float
    rate: float | None = None


def reconstruct_ema(options: EmaOptions) -> list[Reconstructed]:
    """Reconstruct every length of ``options`` at its checkpoint and write it there. Every
    length is checked against the snapshots before anything is read or written."""
    run = as_location(options.run)
    checkpoint, step = checkpoint_folder(run, options.step)
    tracked = _tracked_lengths(checkpoint)
    every = list_snapshots(run)
    if not tracked:
        raise UserInputError(
            f"{checkpoint} was saved by a run that tracked no post-hoc EMA "
            "(its optim.posthoc_ema_stds is empty): choose a checkpoint saved while it tracked"
        )
    snapshots = [(at, path) for at, path in every if at <= step]
    if not snapshots or snapshots[-1][0] != step:
        # Between two snapshots' times no combination represents a profile well (EDM2
        # reconstructs at a snapshot's time): the step must have one.
        steps = ", ".join(str(at) for at, _ in every)
        raise UserInputError(
            f"--step {step}: the run has no post-hoc EMA snapshot at that step (its snapshots' "
            f"steps: {steps}): choose the checkpoint of one of them"
        )
    lengths = [(s, None) for s in options.sigma_rel]
    lengths += [(rate_to_sigma_rel(r, step=step), r) for r in options.rate]
    pairs = [(float(at), float(sigma)) for at, _ in snapshots for sigma in tracked]
    errors = [_checked_error(pairs, step, sigma, rate) for sigma, rate in lengths]
    coefficients = reconstruction_coefficients(pairs, [(float(step), s) for s, _ in lengths])
    states = _combine_snapshots([path for _, path in snapshots], tracked, coefficients)
    written = []
    for (sigma, rate), error, state in zip(lengths, errors, states, strict=True):
        name = f"phema_{profile_key(sigma)}"
        buffer = io.BytesIO()
        torch.save(state, buffer)
        path = checkpoint / f"{name}.pt"
        write_bytes_atomically(path, buffer.getvalue())
        written.append(Reconstructed(name=name, sigma_rel=sigma, path=path, error=error, rate=rate))
    return written


def list_snapshots(run: StoragePath) -> list[tuple[int, StoragePath]]:
    """The run's post-hoc EMA snapshots as (step, file), by step; a UserInputError when it has
    none."""
    folder = as_location(run) / POSTHOC_DIR
    paths = folder.iterdir() if folder.is_dir() else ()
    matches = ((SNAPSHOT_PATTERN.match(path.name), path) for path in paths)
    found = sorted(((int(m.group(1)), path) for m, path in matches if m), key=lambda f: f[0])
    if not found:
        raise UserInputError(
            f"{run} has no post-hoc EMA snapshots ({POSTHOC_DIR}/snapshot_*.pt): train it with "
            "--set optim.posthoc_ema_stds=0.05,0.10 to reconstruct EMA lengths afterwards"
        )
    return found


def _tracked_lengths(checkpoint: StoragePath) -> tuple[str, ...]:
    """The lengths the run tracks, as its snapshots name them (its config's
    ``optim.posthoc_ema_stds``)."""
    file = as_location(checkpoint) / "config.json"
    config = json.loads(file.read_text()) if file.is_file() else {}
    text = str(config.get("optim", {}).get("posthoc_ema_stds", ""))
    return tuple(profile_key(float(v)) for v in text.split(",") if v.strip())


def checkpoint_folder(run: StoragePath, step: int) -> tuple[StoragePath, int]:
    """The checkpoint folder of ``step`` (0: the newest complete one), and its step."""
    if step == 0:
        newest = latest_checkpoint(run)
        if newest is None:
            raise UserInputError(f"{run} has no complete checkpoint to write EMA weights into")
        return as_location(newest), int(newest.name.removeprefix("checkpoint_"))
    folder = run / checkpoint_name(step)
    if not folder.is_dir():
        steps = sorted(p.name for p in run.iterdir() if p.name.startswith("checkpoint_"))
        raise UserInputError(
            f"--step {step}: {run} has no {folder.name}; its checkpoints: "
            f"{', '.join(steps) or '(none)'}"
        )
    return folder, step


def _checked_error(
    pairs: list[tuple[float, float]], step: int, sigma_rel: float, rate: float | None
) -> float:
    """The target's reconstruction error, or a UserInputError saying which lengths fit."""
    error = reconstruction_error(pairs, (float(step), sigma_rel))
    if error <= RECONSTRUCTION_ERROR_LIMIT:
        return error
    good = [
        s
        for s in SIGMA_REL_GRID
        if reconstruction_error(pairs, (float(step), s)) <= RECONSTRUCTION_ERROR_LIMIT
    ]
    possible = _ranges(good) or "none"
    given = f"--rate {rate} (length {sigma_rel:.4f} at step {step})" if rate else f"{sigma_rel}"
    tracked = sorted({s for _, s in pairs})
    raise UserInputError(
        f"EMA length {given} cannot be reconstructed well at step {step} from the snapshots "
        f"(tracked lengths {', '.join(f'{s:.3f}' for s in tracked)}; relative error "
        f"{error:.2g} > {RECONSTRUCTION_ERROR_LIMIT:g}): lengths that can: {possible}"
    )


def _combine_snapshots(
    snapshots: list[StoragePath], tracked: tuple[str, ...], coefficients: np.ndarray
) -> list[dict[str, torch.Tensor]]:
    """sum_i X[i, k] * profile_i for every target k, one snapshot file in memory at a time."""
    sums = [WeightedSum() for _ in range(coefficients.shape[1])]
    row = 0
    for path in snapshots:
        data = as_location(path).read_bytes()
        profiles = torch.load(io.BytesIO(data), weights_only=True)["profiles"]
        missing = sorted(set(tracked) - set(profiles))
        if missing:
            raise UserInputError(
                f"{path} lacks the tracked lengths {missing} (it holds "
                f"{sorted(profiles)}): optim.posthoc_ema_stds changed during the run"
            )
        for sigma in tracked:
            for k, total in enumerate(sums):
                total.add(profiles[sigma], float(coefficients[row, k]))
            row += 1
    return [total.result() for total in sums]


def _ranges(lengths: list[float]) -> str:
    """Lengths of :data:`SIGMA_REL_GRID` as runs of neighbours: ``0.050, 0.090 to 0.105``."""
    step = float(SIGMA_REL_GRID[1] - SIGMA_REL_GRID[0])
    runs: list[list[float]] = []
    for value in lengths:
        if runs and value - runs[-1][-1] <= step * 1.5:
            runs[-1].append(value)
        else:
            runs.append([value])
    return ", ".join(
        f"{run[0]:.3f}" if len(run) == 1 else f"{run[0]:.3f} to {run[-1]:.3f}" for run in runs
    )
