"""Family files: guided-diffusion's family of models as one job (``raydiff family``; the file,
with an example, and every check: docs/family.md). No Ray here.

Every check runs here, before anything starts: each stage's config is built and checked as its
own command builds it, then its role and how the stages fit together; every refusal is one
line naming the stage and the field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

from raydiff.config import (
    ExperimentConfig,
    TrackingConfig,
    field_values,
    from_dict,
    override_text,
    refuse_unknown,
)
from raydiff.config.presets import FAMILY_PREFIX, config_source, read_yaml_mapping, shipped_file
from raydiff.config.resolve import resolve_config
from raydiff.data.manifest import is_dataset
from raydiff.data.prepare import PrepareOptions
from raydiff.errors import ConfigError, UserInputError
from raydiff.train.tasks import task_spec

TRAINING_STAGES = ("base", "classifier", "upsampler", "evaluator")
"""The trained members, in the order the report lists them."""
REQUIRED_STAGES = ("base", "evaluator")
RESOURCES = ("num_workers", "cpus_per_worker", "use_gpu")
"""What a stage's ``resources`` may set: its ``scaling`` section's fields."""


@dataclass(frozen=True, kw_only=True)
class Role:
    """What a training stage must train, and a preset that does."""

    what: str
    command: str
    """The ``raydiff`` command that trains it."""
    example: str
    low_res: bool = False
    noised: bool | None = None
    """A classifier's ``classifier.noised`` (None: not a classifier)."""

    def fits(self, config: ExperimentConfig) -> bool:
        spec = task_spec(config.train.task)
        if (spec.train_command, spec.low_res_input) != (self.command, self.low_res):
            return False
        return self.noised is None or config.classifier.noised == self.noised


ROLES = {
    "base": Role(what="a diffusion model", command="train", example="demo"),
    "classifier": Role(
        what="a noisy classifier (classifier.noised=true)",
        command="train-classifier",
        noised=True,
        example="classifier_demo",
    ),
    "upsampler": Role(
        what="an upsampler (train.task=super_res)",
        command="train",
        low_res=True,
        example="upsampler_demo",
    ),
    "evaluator": Role(
        what="a clean classifier (classifier.noised=false)",
        command="train-classifier",
        noised=False,
        example="evaluator_demo",
    ),
}


@dataclass(frozen=True, kw_only=True)
class TrainingStage:
    """One member: its config as built and checked, and how it is trained."""

    name: str
    source: str
    """The preset or config file it starts from."""
    overrides: tuple[str, ...]
    """Its ``--set`` items (the file's ``set`` and ``resources``, then the command line's)."""
    config: ExperimentConfig
    command: str
    """The ``raydiff`` command that trains it (``train`` / ``train-classifier``)."""

    def argv(self, *, output: str, address: str | None) -> list[str]:
        """The ``raydiff`` command line that trains (or continues) it into ``output``."""
        sets = [item for override in self.overrides for item in ("--set", override)]
        where = ["--address", address] if address else []
        return [self.command, "--config", self.source, *sets, "--output", output, *where]


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """The ``sample`` stage: the guided cascade (``raydiff sample``'s options of the same names),
    and the unguided cascade beside it when the family has a classifier."""

    num_samples: int = 256
    classifier_scale: float = 1.0
    timestep_respacing: str = "ddim25"
    use_ddim: bool = True
    upsampler_respacing: str = "ddim25"
    upsampler_use_ddim: bool = True
    batch_size: int = 64
    num_workers: int = 2
    seed: int = 0
    weights: str | None = None
    classifier_weights: str | None = None
    upsampler_weights: str | None = None

    def __post_init__(self) -> None:
        for name in ("num_samples", "batch_size", "num_workers"):
            if getattr(self, name) < 1:
                raise _refused("sample", name, getattr(self, name), "must be >= 1")
        if self.classifier_scale < 0:
            raise _refused("sample", "classifier_scale", self.classifier_scale, "must be >= 0")


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """The ``evaluate`` stage: the evaluator's data split the samples are judged against (FD,
    precision and recall in its features; its accuracy on the samples' labels)."""

    split: str = "test"
    num_images: int = 0
    """Reference images (0: the whole split)."""

    def __post_init__(self) -> None:
        if self.num_images < 0:
            raise _refused("evaluate", "num_images", self.num_images, "must be >= 0 (0: all)")


@dataclass(frozen=True, kw_only=True)
class Family:
    """A checked family file."""

    source: str
    datasets: dict[str, PrepareOptions]
    stages: dict[str, TrainingStage]
    """The training stages it has, in :data:`TRAINING_STAGES` order."""
    sample: Sampling
    evaluate: Evaluation
    waiting_for_data: tuple[str, ...] = ()
    """Datasets of ``datasets`` not prepared yet: the checks that need their images (classes,
    channels) run once they are (:func:`load_family` again)."""

    @property
    def final_size(self) -> int:
        """The size of the family's samples: the upsampler's, else the base model's."""
        last = self.stages.get("upsampler", self.stages["base"])
        return last.config.model.image_size


def _refused(stage: str, key: str, value: Any, reason: str) -> UserInputError:
    return UserInputError(f"stage {stage}: {key}={value!r} is invalid: {reason}")


def load_family(
    path_or_name: str, *, overrides: list[str] | None = None, max_steps: int | None = None
) -> Family:
    """Read and check a family file, with ``--set STAGE.FIELD=VALUE`` ``overrides`` and
    ``--max-steps`` (a cap on every training stage's ``train.max_steps``)."""
    # A family file's path, or a shipped one's name (family_demo).
    file = shipped_file(path_or_name, prefix=FAMILY_PREFIX, kind="family")
    data = read_yaml_mapping(file, what=f"family file {str(file)!r}", holds="stages")
    blocks = _with_overrides(data, overrides or [])
    datasets = _datasets(blocks.pop("datasets", None) or {})
    waiting = tuple(out for out in datasets if not (Path(out) / "manifest.json").is_file())
    tracking = _tracking(blocks.pop("tracking", None))
    stages = {
        name: _training_stage(
            name, blocks[name], base_dir=file.parent, max_steps=max_steps, tracking=tracking
        )
        for name in TRAINING_STAGES
        if name in blocks
    }
    family = Family(
        source=str(file),
        datasets=datasets,
        stages=stages,
        sample=from_dict(Sampling, blocks.get("sample") or {}, where="stage sample"),
        evaluate=from_dict(Evaluation, blocks.get("evaluate") or {}, where="stage evaluate"),
        waiting_for_data=waiting,
    )
    check_family(family)
    return family


def _with_overrides(data: Mapping[str, Any], overrides: list[str]) -> dict[str, Any]:
    """The file's blocks with ``STAGE.FIELD=VALUE`` items added: a training stage's to its
    ``set``, a ``sample`` / ``evaluate`` option to that block. Unknown blocks are refused."""
    import yaml

    known = ("datasets", "tracking", *TRAINING_STAGES, "sample", "evaluate")
    blocks = {str(key): value for key, value in data.items()}
    refuse_unknown(blocks, known, where="family file")
    for key, value in blocks.items():
        if value is not None and not isinstance(value, Mapping):
            raise UserInputError(f"stage {key}: expected a mapping, got {value!r}")
    for item in overrides:
        target, _, assigned = item.partition("=")
        stage, _, name = target.strip().partition(".")
        if not assigned or not name or stage not in known[1:]:
            raise UserInputError(
                f"--set {item}: expected STAGE.FIELD=VALUE, STAGE one of "
                f"{', '.join(known[1:])} (e.g. base.lr=1e-3)"
            )
        block = dict(blocks.get(stage) or {})
        if stage in TRAINING_STAGES:
            block["set"] = {**(block.get("set") or {}), name: assigned}
        else:
            block[name] = yaml.safe_load(assigned)
        blocks[stage] = block
    for name in REQUIRED_STAGES:
        if not blocks.get(name):
            raise UserInputError(
                f"stage {name}: missing: a family needs {ROLES[name].what} "
                f"(e.g. {name}: {{config: {ROLES[name].example}}})"
            )
    return blocks


def _datasets(block: Any) -> dict[str, PrepareOptions]:
    if not isinstance(block, Mapping):
        raise UserInputError(f"datasets: expected a mapping of folder: options, got {block!r}")
    datasets = {}
    for out, options in block.items():
        values = {**(options or {}), "out": str(out)}
        try:
            datasets[str(out)] = from_dict(PrepareOptions, values, where=f"datasets: {out}")
        except ConfigError as err:
            raise UserInputError(f"datasets: {out}: {err}") from None
    return datasets


def _tracking(block: Any) -> list[str]:
    """The ``tracking`` block (the tracking section's fields, for every training stage) as
    ``--set`` items."""
    values = field_values(TrackingConfig, block or {}, where="stage tracking")
    return [f"tracking.{name}={override_text(value)}" for name, value in values.items()]


def _training_stage(
    name: str,
    block: Mapping[str, Any],
    *,
    base_dir: Path,
    max_steps: int | None,
    tracking: list[str],
) -> TrainingStage:
    """Stage ``name`` built from its block: its config read with its overrides, as ``raydiff
    train`` reads it, fitted to its data where that exists, and checked against its role."""
    refuse_unknown(block, ("config", "set", "resources"), where=f"stage {name}")
    source = _config_source(name, block.get("config"), base_dir=base_dir)
    overrides = [
        *tracking,
        *_items(name, "set", block.get("set")),
        *_resources(name, block.get("resources")),
    ]
    config = _stage_config(name, source, overrides)
    if max_steps is not None and max_steps < config.train.max_steps:
        overrides.append(f"train.max_steps={max_steps}")
        config = _stage_config(name, source, overrides)
    role = ROLES[name]
    if not role.fits(config):
        raise _refused(
            name,
            "train.task",
            config.train.task,
            f"the {name} stage trains {role.what} (e.g. config: {role.example})",
        )
    return TrainingStage(
        name=name, source=source, overrides=tuple(overrides), config=config, command=role.command
    )


def _config_source(stage: str, given: Any, *, base_dir: Path) -> str:
    if not isinstance(given, str) or not given:
        raise UserInputError(
            f"stage {stage}: config: missing: name a preset or config file (e.g. config: "
            f"{ROLES[stage].example})"
        )
    try:
        return config_source(given, beside=base_dir)
    except FileNotFoundError as err:
        raise UserInputError(f"stage {stage}: {err}") from None


def _items(stage: str, key: str, values: Any) -> list[str]:
    if values is None:
        return []
    if not isinstance(values, Mapping):
        raise UserInputError(f"stage {stage}: {key}: expected a mapping of field: value")
    return [f"{name}={override_text(value)}" for name, value in values.items()]


def _resources(stage: str, values: Any) -> list[str]:
    refuse_unknown(values or {}, RESOURCES, where=f"stage {stage}: resources")
    return [f"scaling.{item}" for item in _items(stage, "resources", values)]


def _stage_config(stage: str, source: str, overrides: list[str]) -> ExperimentConfig:
    """The stage's config as ``raydiff train`` builds it (fitted to its data where the data is
    prepared already); a refusal names the stage."""
    try:
        return resolve_config(source, overrides=overrides)[0]
    except (UserInputError, FileNotFoundError) as err:
        raise UserInputError(f"stage {stage}: {err}") from None


def check_family(family: Family) -> None:
    """How the stages fit together (each refusal names the stage and field), and that each
    stage's data is prepared or will be."""
    stages = family.stages
    for stage in stages.values():
        _check_data(stage, family)
    base = stages["base"].config
    if "classifier" in stages:
        _check_guide(stages["classifier"].config, base)
    elif family.sample.classifier_scale != Sampling.classifier_scale:
        raise _refused(
            "sample", "classifier_scale", family.sample.classifier_scale, "no classifier stage"
        )
    if "upsampler" in stages:
        _check_upsampler(stages["upsampler"].config, base)
    _check_weights(family)
    final = stages.get("upsampler", stages["base"]).config
    reason = "it judges the family's final images, whose {field} is {value}"
    keys = ("model.image_size", "model.in_channels")
    _must_agree("evaluator", keys, stages["evaluator"].config, final, reason)


def _must_agree(
    stage: str, keys: Iterable[str], config: ExperimentConfig, other: ExperimentConfig, reason: str
) -> None:
    """Refuse ``stage`` unless each of its ``keys`` (``section.field``) is ``other``'s; ``reason``
    (formatted with the ``field`` and ``other``'s ``value``) says why it must be."""
    for key in keys:
        own, value = attrgetter(key)(config), attrgetter(key)(other)
        if own != value:
            raise _refused(stage, key, own, reason.format(field=key.partition(".")[2], value=value))


def _check_data(stage: TrainingStage, family: Family) -> None:
    data_dir = stage.config.data.data_dir
    if is_dataset(data_dir):
        return
    if Path(data_dir).resolve() not in {Path(out).resolve() for out in family.datasets}:
        raise _refused(
            stage.name,
            "data.data_dir",
            data_dir,
            "no prepared dataset there, and the file's datasets: does not prepare it (add "
            f"'{data_dir}: {{source: ...}}' to datasets:)",
        )


def _check_guide(classifier: ExperimentConfig, base: ExperimentConfig) -> None:
    """guided-diffusion's classifier guidance: the classifier sees the base model's x_t at the
    base model's timesteps, so images, diffusion steps (and a class-conditional base's
    classes) must agree."""
    keys = ["model.image_size", "model.in_channels", "diffusion.diffusion_steps"]
    keys += ["diffusion.noise_schedule", *(["model.num_classes"] if base.model.class_cond else [])]
    _must_agree(
        "classifier", keys, classifier, base, "it guides the base model, whose is {value!r}"
    )


def _check_upsampler(upsampler: ExperimentConfig, base: ExperimentConfig) -> None:
    size = base.model.image_size
    if upsampler.super_res.small_size != size:
        raise _refused(
            "upsampler",
            "super_res.small_size",
            upsampler.super_res.small_size,
            f"it upsamples the base model's samples, which are {size}x{size}",
        )
    reason = "the base model's images have {value}"
    _must_agree("upsampler", ["model.in_channels"], upsampler, base, reason)
    if upsampler.model.class_cond and not base.model.class_cond:
        raise _refused(
            "upsampler",
            "model.class_cond",
            True,
            "the unguided cascade's base samples have no labels (the base model is "
            "unconditional): train the upsampler unconditional",
        )


def _check_weights(family: Family) -> None:
    """The ``sample`` stage's weights names: of a stage the family has; ``ema_<rate>`` one of
    its ``optim.ema_rate``; ``phema_<length>`` (reconstructed after training with ``raydiff
    ema``) of a stage that tracks post-hoc EMA."""
    options = family.sample
    for key, stage in (
        ("weights", "base"),
        ("classifier_weights", "classifier"),
        ("upsampler_weights", "upsampler"),
    ):
        weights = getattr(options, key)
        if weights is None or weights == "model":
            continue
        if stage not in family.stages:
            raise _refused("sample", key, weights, f"the family has no {stage} stage")
        optim = family.stages[stage].config.optim
        rates = [f"ema_{rate}" for rate in optim.ema_rates()]
        if weights.startswith("phema_") and not optim.posthoc_ema_stds:
            raise _refused(
                "sample",
                key,
                weights,
                f"the {stage} stage tracks no post-hoc EMA: set its optim.posthoc_ema_stds "
                "(e.g. 0.05,0.10)",
            )
        if weights.startswith("ema_") and weights not in rates:
            raise _refused(
                "sample",
                key,
                weights,
                f"the {stage} stage keeps {', '.join(rates) or 'no EMA'} (optim.ema_rate)",
            )
