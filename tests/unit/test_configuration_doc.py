"""docs/configuration.md is the generated reference of every config field, and up to date."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from raydiff.config import DATA_FIELDS_DERIVED, ExperimentConfig
from raydiff.config_doc import (
    DOC_PATH,
    REGENERATE,
    attribute_docstrings,
    field_docs,
    render_configuration_doc,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = typing.get_type_hints(ExperimentConfig)


@pytest.fixture(scope="module")
def doc() -> str:
    return render_configuration_doc()


def table_rows(text: str) -> dict[str, list[str]]:
    """``{"model.image_size": [cells...]}`` of the doc's field tables."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("| `") and "." in line.split("|")[1]:
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells
    return rows


def test_the_committed_doc_is_the_generated_one(doc: str) -> None:
    committed = (ROOT / DOC_PATH).read_text()
    assert committed == doc, (
        f"{DOC_PATH} is out of date with the config dataclasses: run `{REGENERATE}` and commit it"
    )
    assert REGENERATE in committed.splitlines()[0], "the header names the regeneration command"


def test_every_field_of_every_section_is_documented(doc: str) -> None:
    rows = table_rows(doc)
    expected = {
        f"{section}.{f.name}" for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)
    }
    assert set(SECTIONS) == {
        "model",
        "classifier",
        "super_res",
        "diffusion",
        "optim",
        "train",
        "data",
        "scaling",
        "evaluation",
        "tracking",
    }
    assert set(rows) == expected
    for dotted, cells in rows.items():
        field_type, default, meaning = cells[1], cells[2], cells[4]
        assert field_type and default and len(meaning) > 10, f"{dotted}: {cells}"


def test_rows_carry_type_default_flag_and_meaning(doc: str) -> None:
    rows = table_rows(doc)
    assert rows["model.num_channels"][1:4] == ["`int`", "`128`", "`--num_channels`"]
    assert rows["model.num_channels"][4].startswith("Base channel count of the UNet")
    assert rows["diffusion.noise_schedule"][1] == '`"linear"` \\| `"cosine"`'
    assert rows["optim.ema_rate"][2:4] == ['`"0.9999"`', "`--ema_rate`"]
    assert rows["data.data_dir"][3] == "`--data_dir`"
    # Not an improved-diffusion flag: no flag.
    assert rows["scaling.num_workers"][3] == ""
    # class_cond is in model and data, but --set class_cond reaches model (data's follows it).
    assert rows["model.class_cond"][3] == "`--class_cond`"
    for name, source in DATA_FIELDS_DERIVED.items():
        assert rows[f"data.{name}"][2:4] == [f"follows `{source}`", ""]


def test_a_field_without_a_docstring_is_an_error() -> None:
    @dataclasses.dataclass(kw_only=True)
    class Section:
        documented: int = 1
        """Has one."""
        bare: int = 2

    assert attribute_docstrings(Section) == {"documented": "Has one."}
    with pytest.raises(ValueError, match=r"Section\.bare has no docstring"):
        field_docs("section", Section)
