"""The post-hoc EMA sweep's report (table, CSV, plot) and its options' checks, without Ray."""

from __future__ import annotations

import csv
import dataclasses
import io
import re
from pathlib import Path

import pytest

from raydiff.ema.reconstruction import EmaOptions
from raydiff.errors import ConfigError, UserInputError
from raydiff.evaluate.ema_sweep_report import (
    SweepRow,
    format_table,
    plot_png,
    sweep_csv,
    write_sweep_report,
)
from raydiff.results_table import Ranking
from raydiff.train.tasks import task_specs

pytestmark = pytest.mark.unit

ROWS = [
    SweepRow(name="phema_0.050", sigma_rel=0.05, error=3e-3, metrics={"fid": 12.5, "val_bpd": 3.1}),
    SweepRow(name="phema_0.080", sigma_rel=0.08, error=1e-3, metrics={"fid": 9.25, "val_bpd": 3.2}),
    SweepRow(name="phema_0.100", sigma_rel=0.1, error=2e-3, metrics={"fid": None, "val_bpd": 3.0}),
    SweepRow(
        name="ema_0.9999",
        sigma_rel=0.2,
        rate=0.9999,
        fixed=True,
        metrics={"fid": 11.0, "val_bpd": 2.9},
    ),
]
FD = Ranking(key="fid", mode="min")


def test_the_best_follows_the_metrics_direction_and_skips_missing_values() -> None:
    assert FD.best(ROWS).name == "phema_0.080"
    assert Ranking(key="fid", mode="max").best(ROWS).name == "phema_0.050"
    assert Ranking(key="val_bpd", mode="min").best(ROWS).name == "ema_0.9999"
    assert Ranking(key="val_acc@1", mode="max").best(ROWS) is None


def test_the_csv_has_a_row_per_weights_at_full_precision_and_marks_the_best() -> None:
    rows = list(csv.DictReader(io.StringIO(sweep_csv(ROWS, FD))))
    assert [r["weights"] for r in rows] == [r.name for r in ROWS]
    assert list(rows[0]) == [
        "weights",
        "sigma_rel",
        "rate",
        "fid",
        "val_bpd",
        "reconstruction_error",
        "best",
    ]
    assert [r["best"] for r in rows] == ["0", "1", "0", "0"]
    assert float(rows[1]["fid"]) == 9.25 and rows[2]["fid"] == ""
    assert rows[3]["rate"] == "0.9999" and rows[3]["reconstruction_error"] == ""
    assert float(rows[0]["reconstruction_error"]) == 3e-3


def test_the_table_marks_and_names_the_best() -> None:
    lines = format_table(ROWS, FD).splitlines()
    assert lines[0].split() == ["weights", "sigma_rel", "rate", "fid", "val_bpd", "recon_error"]
    [marked] = [line for line in lines[1:-1] if line.startswith("*")]
    assert "phema_0.080" in marked and "9.25" in marked
    assert lines[-1] == "best: phema_0.080 (sigma_rel 0.0800), fid 9.25 (lower is better)"
    none = format_table(ROWS, Ranking(key="val_acc@1", mode="max")).splitlines()[-1]
    assert none == "best: none (no weights has a finite val_acc@1)"


def test_the_plot_is_a_png_and_the_report_is_written(tmp_path: Path) -> None:
    assert plot_png(ROWS, FD, title="t")[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_png([], FD, title="empty")[:4] == b"\x89PNG"  # nothing to draw: axes only
    report = write_sweep_report(tmp_path / "sweep", ROWS, FD, title="run, step 8")
    assert report.csv.read_text() == sweep_csv(ROWS, FD)
    assert report.plot.read_bytes()[:4] == b"\x89PNG"
    assert report.best is ROWS[1]
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == ["sweep.csv", "sweep.png"]


def test_every_task_declares_what_its_sweep_measures() -> None:
    specs = task_specs()
    assert {name: spec.posthoc_sweep for name, spec in specs.items()} == {
        "classifier": "validation",
        "diffusion": "samples",
        "super_res": "samples",
    }
    classifier = specs["classifier"]
    assert classifier.objectives[0] == "val_acc@1"
    assert classifier.metric("val_acc@1").objective == "max"


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"num_samples": -1}, "num_samples"),
        ({"num_images": 0}, "num_images"),
        ({"num_workers": 0}, "num_workers"),
        ({"features": "c", "inception": "i"}, "features"),
    ],
)
def test_evaluation_options_out_of_range_are_refused(given: dict, field: str) -> None:
    with pytest.raises(ConfigError) as error:
        EmaOptions(run="r", sigma_rel=(0.05,), evaluate=True, **given)
    assert error.value.field == field


def test_sweep_flags_without_evaluate_are_refused() -> None:
    with pytest.raises(UserInputError, match="--features / --num-samples apply to a sweep"):
        EmaOptions(run="r", sigma_rel=(0.05,), features="c", num_samples=4)


def test_the_evaluate_options_are_the_evaluation_commands_own() -> None:
    """``--evaluate``'s options are ``raydiff evaluate fid``'s, ``evaluate bpd``'s and
    ``sample``'s (``flags.included``): their flags and help, with the sweep's defaults."""
    from raydiff.cli.app import build_parser
    from raydiff.evaluate.options import BpdOptions, FidOptions

    args = build_parser().parse_args(["ema", "--run", "r", "--sigma-rel", "0.05"])
    names = "num_images num_workers timestep_respacing use_ddim bpd_respacing seed num_samples"
    assert [getattr(args, n) for n in names.split()] == [64, 1, "ddim25", True, "", 0, 0]
    ema = {f.name: f.metadata for f in dataclasses.fields(EmaOptions)}
    fid = {f.name: f.metadata for f in dataclasses.fields(FidOptions)}
    bpd = {f.name: f.metadata for f in dataclasses.fields(BpdOptions)}
    assert ema["features"]["help"].endswith(fid["features"]["help"])
    assert ema["bpd_respacing"]["flag"] == "--bpd-respacing"
    assert ema["bpd_respacing"]["help"].endswith(bpd["timestep_respacing"]["help"])


def ema_options(tmp_path: Path, text: str, *argv: str) -> EmaOptions:
    """The options ``raydiff ema --config FILE ARGV`` runs with, ``text`` the file."""
    from raydiff.cli.app import build_parser
    from raydiff.cli.arguments import options_from_args, read_options_file

    file = tmp_path / "ema.yaml"
    file.write_text(text)
    args = build_parser().parse_args(["ema", "--config", str(file), *argv])
    return options_from_args(
        EmaOptions, args, file_values=read_options_file(args.config, EmaOptions)
    )


SWEEP_FILE = """\
run: runs/demo
sigma_rel: 0.04:0.12:5
evaluate: true
features: runs/evaluator_demo/checkpoint_001200
num-samples: 256          # a flag's name works too
num_workers: 2
"""


def test_a_sweep_file_gives_the_options_and_typed_flags_win(tmp_path: Path) -> None:
    options = ema_options(tmp_path, SWEEP_FILE, "--num-workers", "3")
    assert options.run == "runs/demo" and options.evaluate
    assert options.sigma_rel == pytest.approx((0.04, 0.06, 0.08, 0.10, 0.12))
    assert options.features == "runs/evaluator_demo/checkpoint_001200"
    assert options.num_samples == 256 and options.num_workers == 3
    assert options.timestep_respacing == "ddim25"  # neither gives it: the default
    listed = ema_options(tmp_path, "run: r\nsigma_rel: [0.05, 0.1]\n")
    assert listed.sigma_rel == (0.05, 0.1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("run: r\nsigma: 0.1\n", "ema.yaml: unknown key 'sigma' (valid: config, run, sigma_rel,"),
        ("run: r\nsigma_rel: 0.1\nnum_samples: many\n", "ema.num_samples='many' is invalid"),
        ("run: r\nsigma_rel: 0.1\nnum_workers: true\n", "ema.num_workers=True is invalid"),
        ("run: r\nsigma_rel: {a: 1}\n", "ema.sigma_rel=\"{'a': 1}\" is invalid: expected lengths"),
        ("- run\n", "must hold a mapping of options"),
        ("run: [\n", "is not valid YAML"),
    ],
)
def test_a_bad_sweep_file_is_refused_naming_the_key(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(UserInputError, match=re.escape(message)):
        ema_options(tmp_path, text)


def test_a_sweep_without_a_run_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="give --run RUN"):
        ema_options(tmp_path, "sigma_rel: 0.1\n")
