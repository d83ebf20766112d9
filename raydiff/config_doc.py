"""Render docs/configuration.md from the config dataclasses and their field docstrings.

The reference of every config field is generated, not written: each section of
:class:`~raydiff.config.ExperimentConfig` gives its fields' names, types and defaults, and the
string literal after each field (its attribute docstring, read from the source with ``ast``) gives
the meaning. A unit test compares the committed file with this output, so a new or changed field
shows up in the doc or fails the test. Regenerate with ``make config-doc``, i.e.
``python -m raydiff.config_doc --output docs/configuration.md``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import re
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from raydiff.config import DATA_FIELDS_DERIVED, FLAGS_ELSEWHERE, ExperimentConfig, resolve_field
from raydiff.errors import UserInputError

REGENERATE = "make config-doc"
"""The command that rewrites docs/configuration.md (named in its header and in test failures)."""

DOC_PATH = Path("docs") / "configuration.md"
"""Where the generated reference lives, relative to the repository root."""

IMPROVED_DIFFUSION_FLAGS = frozenset(
    {
        # improved-diffusion's scripts/image_train.py and script_util.model_and_diffusion_defaults
        "data_dir",
        "schedule_sampler",
        "lr",
        "weight_decay",
        "lr_anneal_steps",
        "batch_size",
        "microbatch",
        "ema_rate",
        "log_interval",
        "save_interval",
        "use_fp16",
        "image_size",
        "num_channels",
        "num_res_blocks",
        "num_heads",
        "num_heads_upsample",
        "attention_resolutions",
        "dropout",
        "learn_sigma",
        "sigma_small",
        "class_cond",
        "diffusion_steps",
        "noise_schedule",
        "timestep_respacing",
        "use_kl",
        "predict_xstart",
        "rescale_timesteps",
        "rescale_learned_sigmas",
        "use_checkpoint",
        "use_scale_shift_norm",
        # guided-diffusion's additions to model_and_diffusion_defaults
        "num_head_channels",
        "channel_mult",
        "resblock_updown",
        "use_new_attention_order",
    }
)
"""Training flags of improved-/guided-diffusion (their ``image_train.py`` argparser) that a
raydiff field carries under the same name."""


@dataclasses.dataclass(frozen=True)
class FieldDoc:
    """One config field as the reference shows it."""

    section: str
    name: str
    type: str
    default: str
    flag: str
    """``--name`` where the field is an improved-/guided-diffusion flag that ``--set name=...``
    reaches; "" otherwise."""
    meaning: str

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.name}"


def attribute_docstrings(cls: type) -> dict[str, str]:
    """``{field: docstring}`` for the string literals that follow annotated fields in ``cls``."""
    source = textwrap.dedent(inspect.getsource(cls))
    (node,) = ast.parse(source).body
    assert isinstance(node, ast.ClassDef), f"{cls.__name__}'s source is not a class"
    docs = {}
    for stmt, following in zip(node.body, node.body[1:], strict=False):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[stmt.target.id] = inspect.cleandoc(following.value.value)
    return docs


def sections() -> list[tuple[str, type]]:
    """``(name, dataclass)`` of each section of an experiment config, in declaration order."""
    hints = typing.get_type_hints(ExperimentConfig)
    return [(f.name, hints[f.name]) for f in dataclasses.fields(ExperimentConfig)]


def field_docs(section: str, cls: type) -> list[FieldDoc]:
    """Every field of one section; a field without a docstring is an error (document it)."""
    hints = typing.get_type_hints(cls)
    docs = attribute_docstrings(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if not docs.get(f.name, "").strip():
            raise ValueError(
                f"{cls.__name__}.{f.name} has no docstring: add a string literal on the line "
                "after the field saying what it means"
            )
        dotted = f"{section}.{f.name}"
        derived = DATA_FIELDS_DERIVED.get(f.name) if section == "data" else None
        default = f"follows `{derived}`" if derived else f"`{_format_value(_default(f))}`"
        rows.append(
            FieldDoc(
                section=section,
                name=f.name,
                type=_format_type(hints[f.name]),
                default=default,
                flag=f"`--{f.name}`" if _flag_reaches(f.name, dotted) else "",
                meaning=_one_line(docs[f.name]),
            )
        )
    return rows


def render_configuration_doc() -> str:
    """The text of docs/configuration.md."""
    section_docs = attribute_docstrings(ExperimentConfig)
    lines = [
        f"_Generated by `{REGENERATE}` (`python -m raydiff.config_doc --output {DOC_PATH}`) from "
        "the config dataclasses in raydiff/config/ and raydiff/data/config.py: edit their "
        "field docstrings, not this file._",
        "",
        "# Configuration reference",
        "",
        "Every field of a raydiff experiment config, as `raydiff train`, `raydiff sweep` and the "
        "presets (`configs/*.yaml`) take it. A YAML config (`--config FILE` or a preset's name) "
        "nests fields under their section; `--set section.field=value` overrides one (repeatable), "
        "and a field whose name no other section uses may be given bare (`--set lr=3e-4`). "
        "The improved-diffusion flag column names the improved-/guided-diffusion training flag "
        "a field keeps, so their flags carry over as `--set name=value`. The resolved config is "
        "saved with every run and checkpoint.",
        "",
        "```yaml",
        "model:",
        "  num_channels: 64",
        "diffusion:",
        "  noise_schedule: cosine",
        "train:",
        "  batch_size: 128",
        "```",
        "",
    ]
    for name, cls in sections():
        lines += [f"## `{name}`", ""]
        lines += [_one_line(inspect.cleandoc(cls.__doc__ or "") or section_docs[name]), ""]
        lines += [
            "| field | type | default | improved-diffusion flag | meaning |",
            "| --- | --- | --- | --- | --- |",
        ]
        for row in field_docs(name, cls):
            cells = [f"`{row.dotted}`", row.type, row.default, row.flag, row.meaning]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        lines.append("")
        derived = [f"`{name}.{f}`" for f in DATA_FIELDS_DERIVED if name == "data"]
        if derived:
            lines += [
                f"{', '.join(derived)} follow the sections named in their default: a config "
                "cannot disagree with itself, so set those fields there (`--set` refuses these).",
                "",
            ]
    lines += [
        "## improved-diffusion flags that are not fields",
        "",
        "| flag | instead |",
        "| --- | --- |",
    ]
    for flag, instead in FLAGS_ELSEWHERE.items():
        lines.append(f"| `--{flag}` | {_cell(_markdown(instead))} |")
    return "\n".join(lines) + "\n"


def _flag_reaches(name: str, dotted: str) -> bool:
    """Whether ``name`` is an improved-diffusion flag that ``--set name=...`` sets on ``dotted``."""
    if name not in IMPROVED_DIFFUSION_FLAGS:
        return False
    try:
        return ".".join(resolve_field(name)) == dotted
    except UserInputError:  # the name is in several sections: only section.field reaches it
        return False


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise ValueError(f"field {f.name} has no default; the reference cannot show one")


def _format_value(value: Any) -> str:
    """A default as it would be written in YAML or ``--set``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def _format_type(hint: Any) -> str:
    if get_origin(hint) is Literal:
        return " \\| ".join(f"`{_format_value(v)}`" for v in get_args(hint))
    if isinstance(hint, type):
        return f"`{hint.__name__}`"
    return f"`{hint}`".replace("typing.", "")


def _markdown(text: str) -> str:
    """reStructuredText's ``literal`` and :role:`x` as Markdown code."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return re.sub(r"``([^`]+)``", r"`\1`", text)


def _one_line(text: str) -> str:
    return _markdown(" ".join(text.split()))


def _cell(text: str) -> str:
    # A bare | would end the table cell; inside backticks GitHub still needs it escaped.
    return re.sub(r"(?<!\\)\|", r"\\|", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m raydiff.config_doc", description="render docs/configuration.md"
    )
    parser.add_argument("--output", help="file to write (default: print to stdout)")
    args = parser.parse_args(argv)
    text = render_configuration_doc()
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
