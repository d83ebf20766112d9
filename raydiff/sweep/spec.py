"""Sweep files: a base training config, overrides for every trial, and a search space (the
file, with an example: docs/sweeps.md; each field: :class:`SweepConfig`).

Everything here is checked before any trial starts (:func:`load_sweep`), including that every
trial the space can produce is a valid training config. No Ray here.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from raydiff.config import (
    SWEEP_PREFIX,
    ExperimentConfig,
    apply_overrides,
    field_type,
    from_dict,
    load_config,
    override_text,
    resolve_field,
)
from raydiff.config.presets import config_source, read_yaml_mapping, shipped_file
from raydiff.config.resolve import resolve_config
from raydiff.data.manifest import Manifest
from raydiff.errors import ConfigError, UserInputError
from raydiff.results_table import Mode, Ranking
from raydiff.seeding import derive_seed
from raydiff.train.preflight import check_run

if TYPE_CHECKING:
    from raydiff.train.task import TaskSpec

SearchKind = Literal["choice", "grid", "uniform", "loguniform", "randint"]
SearchAlgorithm = Literal["random", "optuna"]
SchedulerName = Literal["asha", "none"]

MAX_CHECKED_TRIALS = 4096
"""Combinations checked before a sweep starts; larger spaces are checked one field at a time."""


def _fail(name: str, value: Any, reason: str) -> ConfigError:
    return ConfigError(section="sweep", field=name, value=value, reason=reason)


@dataclass(kw_only=True, frozen=True)
class SearchDimension:
    """One swept field: ``key`` as written, ``section.field`` it sets, how values are drawn."""

    key: str
    """The name as the sweep file writes it (``lr`` or ``optim.lr``): results use it."""
    field: str
    """The config field it sets, as ``section.field``."""
    kind: SearchKind
    """choice / grid: one of ``values``; uniform / loguniform: a float in [low, high];
    randint: an integer in [low, high) (Ray Tune's convention)."""
    values: tuple[Any, ...]
    """choice / grid: the values; uniform / loguniform / randint: ``(low, high)``."""

    def values_to_check(self) -> tuple[Any, ...]:
        """Values whose trials must be valid configs: every listed value, or both bounds."""
        if self.kind in ("choice", "grid"):
            return self.values
        low, high = self.values
        return (low, high - 1) if self.kind == "randint" else (low, high)


@dataclass(kw_only=True)
class SchedulerConfig:
    """Early stopping: ASHA on the sweep's metric, or none (every trial runs to the end)."""

    name: SchedulerName = "asha"
    """``asha`` (asynchronous successive halving) or ``none``."""
    grace_period: int = 0
    """Steps every trial trains before it can be stopped (0: the base config's eval_interval)."""
    reduction_factor: float = 2.0
    """At each rung only the best 1/reduction_factor of trials go on."""

    def __post_init__(self) -> None:
        if self.grace_period < 0:
            raise _fail("scheduler.grace_period", self.grace_period, "must be >= 1 (0: default)")
        if not self.reduction_factor > 1:
            raise _fail("scheduler.reduction_factor", self.reduction_factor, "must be > 1")


@dataclass(kw_only=True)
class SweepConfig:
    """A sweep: which training config, which fields vary, how trials are searched and stopped."""

    base: str = "demo"
    """The training config every trial starts from: a preset's name or a YAML file."""
    set: dict[str, Any] = field(default_factory=dict)
    """Overrides of the base config for every trial (``--set`` adds to them)."""
    search_space: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Field -> ``{choice|grid|uniform|loguniform|randint: values}``."""
    num_samples: int = 1
    """Trials to draw (with grid dimensions: repeats of every grid combination)."""
    max_concurrent_trials: int = 0
    """Trials running at once (0: as many as the cluster's CPUs, or GPUs, hold)."""
    search: SearchAlgorithm = "random"
    """``random`` (random and grid search) or ``optuna`` (Optuna's TPE)."""
    metric: str = ""
    """The objective: a metric the base config's task reports (its spec's ``objectives``; a
    diffusion model's ``val_bpd``, ``val_mse``, ``loss``...; a classifier's ``val_acc@1``...).
    Empty: the task's first objective (``val_bpd``; a classifier's ``val_acc@1``)."""
    mode: Mode | None = None
    """Minimise or maximise the objective (empty: the metric's own direction, ``max`` for an
    accuracy, ``min`` for a loss or bits/dim)."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """Early stopping."""
    seed: int = 0
    """Seed of the search; trial seeds derive from it unless the sweep sets or sweeps one."""

    def __post_init__(self) -> None:
        if not isinstance(self.set, Mapping):
            raise _fail("set", self.set, "expected a mapping of field: value")
        if not isinstance(self.search_space, Mapping) or not self.search_space:
            raise _fail(
                "search_space",
                self.search_space,
                "expected a mapping of field: {choice: [...]} (or grid, uniform, loguniform, "
                "randint) with at least one field",
            )
        if self.num_samples < 1:
            raise _fail("num_samples", self.num_samples, "must be >= 1")
        if self.max_concurrent_trials < 0:
            raise _fail("max_concurrent_trials", self.max_concurrent_trials, "must be >= 0")
        from raydiff.train.tasks import task_specs  # the tasks import torch: only when asked

        # Every metric some task's spec lets a sweep optimise.
        specs = task_specs().values()
        objectives = tuple(dict.fromkeys(key for spec in specs for key in spec.objectives))
        if self.metric and self.metric not in objectives:
            raise _fail("metric", self.metric, f"valid: {', '.join(objectives)}")
        if self.seed < 0:
            raise _fail("seed", self.seed, "must be >= 0")
        dims = self.dimensions()
        if self.search == "optuna" and any(d.kind == "grid" for d in dims):
            grid = next(d.key for d in dims if d.kind == "grid")
            raise _fail(
                f"search_space.{grid}",
                "grid",
                "Optuna's TPE does not take grid dimensions: use choice, or search: random",
            )

    def dimensions(self) -> tuple[SearchDimension, ...]:
        """The search space, each field resolved and its values checked."""
        return tuple(_dimension(key, spec) for key, spec in self.search_space.items())

    def set_items(self) -> list[str]:
        """``set`` as ``--set`` items."""
        return [f"{key}={override_text(value)}" for key, value in self.set.items()]


def with_objective(sweep: SweepConfig, task_name: str) -> SweepConfig:
    """``sweep`` with its objective and direction for the task ``task_name``: the task's first
    objective where none was given, the metric's own direction where no ``mode`` was; refused
    when the task does not report the metric."""
    from raydiff.train.tasks import task_spec  # the tasks import torch: only when asked

    task = task_spec(task_name)
    metric = sweep.metric or task.objectives[0]
    if metric not in task.objectives:
        raise _fail(
            "metric",
            metric,
            f"the base config trains train.task={task.name!r}, which reports "
            f"{', '.join(task.objectives)}",
        )
    mode = sweep.mode or task.metric(metric).objective
    return dataclasses.replace(sweep, metric=metric, mode=mode)


def _dimension(key: str, spec: Any) -> SearchDimension:
    section, name = resolve_field(str(key))
    where = f"search_space.{key}"
    kinds = get_args(SearchKind)
    if not isinstance(spec, Mapping) or len(spec) != 1 or next(iter(spec)) not in kinds:
        raise _fail(
            where,
            spec,
            f"expected one of {{{': [...]}, {'.join(kinds)}: [...]}} (e.g. {{choice: [a, b]}} "
            f"or {{loguniform: [1.0e-4, 1.0e-3]}})",
        )
    kind, values = next(iter(spec.items()))
    if not isinstance(values, list | tuple):
        raise _fail(where, spec, f"{kind} takes a list")
    values = tuple(values)
    hint = field_type(section, name)
    if kind in ("choice", "grid"):
        if not values:
            raise _fail(where, spec, f"an empty {kind}: list at least one value")
        if len(set(map(repr, values))) != len(values):
            raise _fail(where, spec, f"{kind} lists a value twice")
    else:
        if len(values) != 2 or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in values
        ):
            raise _fail(where, spec, f"{kind} takes two numbers: [low, high]")
        low, high = values
        if not low < high:
            raise _fail(where, spec, f"{kind} needs low < high")
        if kind == "loguniform" and low <= 0:
            raise _fail(where, spec, "loguniform bounds must be > 0 (it samples log(value))")
        if kind == "randint":
            if hint is not int:
                raise _fail(where, spec, f"randint draws integers; {section}.{name} is not one")
            if not (float(low).is_integer() and float(high).is_integer()):
                raise _fail(where, spec, "randint bounds must be integers")
            values = (int(low), int(high))
        elif hint is not float:
            raise _fail(
                where,
                spec,
                f"{kind} draws real numbers; {section}.{name} is not a float field "
                f"(use choice, or randint for an integer field)",
            )
    return SearchDimension(key=str(key), field=f"{section}.{name}", kind=kind, values=values)


@dataclass(kw_only=True)
class LoadedSweep:
    """A checked sweep: its settings, the base config every trial starts from, its dimensions."""

    sweep: SweepConfig
    source: dict[str, Any]
    """The sweep file's mapping as read."""
    overrides: list[str]
    """``--set`` items given besides the file's ``set``."""
    raw_base_config: ExperimentConfig
    """The base config as its file or preset gives it (no overrides)."""
    base_config: ExperimentConfig
    """What every trial starts from: the base with every override, fitted to the data."""
    dimensions: tuple[SearchDimension, ...]
    seed_is_fixed: bool
    """The sweep sets or sweeps ``train.seed``: trials do not get seeds of their own."""

    def all_overrides(self) -> dict[str, str]:
        """The file's ``set`` and the ``--set`` items together (later ones win), as a mapping."""
        items = self.sweep.set_items() + self.overrides
        return {key.strip(): value.strip() for key, _, value in (i.partition("=") for i in items)}

    @property
    def task(self) -> TaskSpec:
        """The spec of the task every trial trains."""
        from raydiff.train.tasks import task_spec  # the tasks import torch: only when asked

        return task_spec(self.base_config.train.task)

    @property
    def ranking(self) -> Ranking:
        """The objective and its direction (:func:`with_objective` gave both)."""
        return Ranking(key=self.sweep.metric, mode=self.sweep.mode)  # type: ignore[arg-type]

    @property
    def max_steps(self) -> int:
        return self.base_config.train.max_steps

    @property
    def grace_period(self) -> int:
        """ASHA's grace period in steps (the default: the first evaluation)."""
        train = self.base_config.train
        return self.sweep.scheduler.grace_period or train.eval_interval or train.max_steps

    def trial_config(self, params: Mapping[str, Any], *, trial_number: int) -> ExperimentConfig:
        """The training config of the trial that drew ``params`` (``section.field`` -> value)."""
        items = [f"{name}={override_text(value)}" for name, value in params.items()]
        if not self.seed_is_fixed:
            items.append(f"train.seed={trial_seed(self.sweep.seed, trial_number)}")
        config = apply_overrides(self.base_config, items)
        config.train.check_worker_sizes(config.scaling.worker_sizes)
        return config


def trial_seed(sweep_seed: int, trial_number: int) -> int:
    """Trial ``trial_number``'s training seed: distinct per trial, reproducible per sweep."""
    return derive_seed(sweep_seed, "trial", trial_number, bits=31)


def load_sweep(
    path_or_data: str | Path | Mapping[str, Any],
    *,
    overrides: list[str] | None = None,
    manifest_for: Callable[[str], Manifest] | None = None,
) -> LoadedSweep:
    """Read and check a sweep file (or its mapping) plus ``--set`` overrides for every trial.

    Refuses, before any trial could start: unknown fields, malformed distributions, a field both
    set and swept, and any combination of values (bounds for ranges) that is not a valid
    training config (e.g. a batch that does not split over the workers). The base config is
    built as ``raydiff train`` builds it (:func:`~raydiff.config.resolve.resolve_config`:
    fitted to its dataset, the one prepared already or ``manifest_for(data_dir)``'s), and every
    trial is checked against that dataset too.
    """
    base_dir = Path.cwd()
    if isinstance(path_or_data, Mapping):
        data = dict(path_or_data)
    else:
        # A sweep file's path, or a shipped one's by name (sweep_demo).
        file = shipped_file(str(path_or_data), prefix=SWEEP_PREFIX, kind="sweep")
        base_dir = file.parent
        data = read_yaml_mapping(file, what=f"sweep file {str(file)!r}", holds="sweep settings")
    sweep = from_dict(SweepConfig, data, where="sweep")
    dimensions = sweep.dimensions()
    set_items = sweep.set_items() + list(overrides or [])
    set_fields = {".".join(resolve_field(item.partition("=")[0])) for item in set_items}
    for dim in dimensions:
        if dim.field in set_fields:
            raise _fail(
                f"search_space.{dim.key}",
                dict([(dim.kind, list(dim.values))]),
                f"{dim.field} is also set for every trial (set: / --set): sweep it or set it",
            )
    fields = [d.field for d in dimensions]
    if len(set(fields)) != len(fields):
        twice = next(f for f in fields if fields.count(f) > 1)
        raise _fail("search_space", twice, "names one field twice")
    base = config_source(sweep.base, beside=base_dir)
    raw_base_config = load_config(base)
    base_config, manifest = resolve_config(base, overrides=set_items, manifest_for=manifest_for)
    sweep = with_objective(sweep, base_config.train.task)
    loaded = LoadedSweep(
        sweep=sweep,
        source=dict(data),
        overrides=list(overrides or []),
        raw_base_config=raw_base_config,
        base_config=base_config,
        dimensions=dimensions,
        seed_is_fixed="train.seed" in set_fields or "train.seed" in fields,
    )
    check_trials(loaded, manifest=manifest)
    return loaded


def check_trials(loaded: LoadedSweep, *, manifest: Manifest | None = None) -> None:
    """Build the config of every combination of values (range bounds for ranges) and refuse
    the sweep, naming the values, if one of them is not a valid training config (or, given the
    dataset's ``manifest``, could not train on it)."""
    dims = loaded.dimensions
    combos = math.prod(len(d.values_to_check()) for d in dims)
    if combos <= MAX_CHECKED_TRIALS:
        candidates = (
            dict(zip([d.field for d in dims], values, strict=True))
            for values in itertools.product(*(d.values_to_check() for d in dims))
        )
    else:  # too many to build: each value against the first of every other field
        first = {d.field: d.values_to_check()[0] for d in dims}
        candidates = ({**first, d.field: value} for d in dims for value in d.values_to_check())
    keys = {d.field: d.key for d in dims}
    for params in candidates:
        try:
            config = loaded.trial_config(params, trial_number=0)
            if manifest is not None:
                check_run(config, manifest=manifest)
        except UserInputError as error:
            drawn = ", ".join(f"{keys[f]}={v}" for f, v in params.items())
            raise UserInputError(
                f"the search space holds invalid trials: with {drawn}: {error}"
            ) from None


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def trial_run_name(trial_number: int, values: Mapping[str, Any]) -> str:
    """A trial's folder name: its number and its swept values (``t0003_noise_schedule-cosine_
    lr-0.00123``), so TensorBoard's run list says what each curve is. Only letters, digits and
    ``_.-`` (a Ray Train run name)."""
    parts = [f"t{trial_number:04d}"]
    for key, value in values.items():
        shown = f"{value:.3g}" if isinstance(value, float) else str(value)
        parts.append(_UNSAFE.sub("-", f"{key.rpartition('.')[2]}-{shown}"))
    return "_".join(parts)[:150]
