"""Typed, validated configuration with improved-diffusion's flag names and defaults.

One module per section (:mod:`~raydiff.config.model`, :mod:`~raydiff.config.classifier`,
:mod:`~raydiff.config.super_res`, :mod:`~raydiff.config.diffusion`, :mod:`~raydiff.config.optim`,
:mod:`~raydiff.config.train`, :mod:`~raydiff.config.scaling`, :mod:`~raydiff.config.evaluation`,
:mod:`~raydiff.config.tracking`;
the data section is :mod:`raydiff.data.config`), :mod:`~raydiff.config.field_values` (the error
for a bad value, comma-separated values), :mod:`~raydiff.config.experiment`
(the sections of one run and the fields one takes from another),
:mod:`~raydiff.config.overrides` (dicts, type conversion, ``--set``) and
:mod:`~raydiff.config.presets` (YAML files and the shipped presets). Every name is importable
from ``raydiff.config``. Nothing here imports torch or Ray.
"""

from raydiff.config.diffusion import DiffusionConfig, NoiseSchedule
from raydiff.config.evaluation import EvaluationConfig
from raydiff.config.experiment import DATA_FIELDS_DERIVED, ExperimentConfig, derive_sections
from raydiff.config.field_values import parse_int_list
from raydiff.config.model import CHANNEL_MULT_BY_IMAGE_SIZE, ModelConfig
from raydiff.config.optim import OptimConfig
from raydiff.config.overrides import (
    FLAG_ALIASES,
    FLAGS_ELSEWHERE,
    apply_overrides,
    coerce,
    config_from_flags,
    field_type,
    field_values,
    from_dict,
    override_text,
    refuse_unknown,
    resolve_field,
    set_fields,
    to_dict,
)
from raydiff.config.presets import (
    PRESETS_DIR,
    SWEEP_PREFIX,
    load_config,
    preset_names,
    read_config,
    resolve_config_path,
    to_yaml,
)
from raydiff.config.scaling import ScalingConfig
from raydiff.config.super_res import SuperResConfig
from raydiff.config.tracking import TrackingConfig
from raydiff.config.train import (
    CompileMode,
    Precision,
    ScheduleSamplerName,
    TrainConfig,
    compile_wanted,
)
from raydiff.data.config import DataConfig

__all__ = [
    "CHANNEL_MULT_BY_IMAGE_SIZE",
    "DATA_FIELDS_DERIVED",
    "FLAGS_ELSEWHERE",
    "FLAG_ALIASES",
    "PRESETS_DIR",
    "SWEEP_PREFIX",
    "CompileMode",
    "DataConfig",
    "DiffusionConfig",
    "EvaluationConfig",
    "ExperimentConfig",
    "ModelConfig",
    "NoiseSchedule",
    "OptimConfig",
    "Precision",
    "ScalingConfig",
    "ScheduleSamplerName",
    "SuperResConfig",
    "TrackingConfig",
    "TrainConfig",
    "apply_overrides",
    "coerce",
    "compile_wanted",
    "config_from_flags",
    "derive_sections",
    "field_type",
    "field_values",
    "from_dict",
    "load_config",
    "override_text",
    "parse_int_list",
    "preset_names",
    "read_config",
    "refuse_unknown",
    "resolve_config_path",
    "resolve_field",
    "set_fields",
    "to_dict",
    "to_yaml",
]
