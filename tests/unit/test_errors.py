"""User mistakes are structured errors shown as one line; bugs keep their traceback."""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import raydiff.data.prepare
from raydiff.cli import build_parser, main, render_error
from raydiff.errors import ConfigError, UserInputError


def test_config_error_fields_and_rendering() -> None:
    error = ConfigError(section="scaling", field="num_workers", value=0, reason="must be >= 1")
    assert isinstance(error, UserInputError) and isinstance(error, ValueError)
    assert (error.section, error.field, error.value, error.reason) == (
        "scaling",
        "num_workers",
        0,
        "must be >= 1",
    )
    assert str(error) == "scaling.num_workers=0 is invalid: must be >= 1"
    assert error.render() == str(error)
    assert error.render("--num-workers") == "--num-workers 0 is invalid: must be >= 1"
    text = ConfigError(section="data", field="data_dir", value="", reason="give a path")
    assert text.render("--data") == "--data '' is invalid: give a path"


def test_config_error_survives_pickling() -> None:
    """Ray pickles exceptions raised in workers; keyword-only arguments need help for that."""
    error = ConfigError(section="model", field="image_size", value=30, reason="not a multiple")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is ConfigError and str(copy) == str(error)
    assert (copy.section, copy.field, copy.value, copy.reason) == (
        "model",
        "image_size",
        30,
        "not a multiple",
    )


def test_errors_module_imports_nothing_of_raydiff() -> None:
    code = (
        "import sys, raydiff.errors; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('ray', 'torch') "
        "or (m.startswith('raydiff.') and m != 'raydiff.errors')]; "
        "assert not bad, bad[:5]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cli_prints_a_config_mistake_as_one_line_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "ds")
    assert main(["prepare", "fashion-mnist", "--out", out, "--workers", "0"]) == 1
    err = capsys.readouterr().err
    assert err == "raydiff prepare: error: --workers 0 is invalid: valid: integers >= 1\n"
    assert main(["prepare", "fashion-mnist", "--out", out, "--compress-level", "12"]) == 1
    err = capsys.readouterr().err
    assert err == "raydiff prepare: error: --compress-level 12 is invalid: valid: 0-9\n"
    assert "Traceback" not in err and err.count("\n") == 1


def test_cli_lets_a_bug_propagate_with_its_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(options: object) -> None:
        raise ValueError("expected a 4D tensor")  # what a bug inside torch looks like

    monkeypatch.setattr(raydiff.data.prepare, "prepare_dataset", broken)
    with pytest.raises(ValueError, match="expected a 4D tensor") as info:
        main(["prepare", "fashion-mnist", "--out", str(tmp_path / "ds"), "--quiet"])
    assert not isinstance(info.value, UserInputError)


def test_train_errors_name_the_flag_only_when_the_flag_set_the_field() -> None:
    error = ConfigError(section="train", field="max_steps", value=0, reason="must be >= 1")
    typed = build_parser().parse_args(["train", "--max-steps", "0", "--num-workers", "0"])
    assert render_error(error, typed) == "--max-steps 0 is invalid: must be >= 1"
    by_set = build_parser().parse_args(["train", "--set", "max_steps=0"])
    assert render_error(error, by_set) == "train.max_steps=0 is invalid: must be >= 1"
    workers = ConfigError(section="scaling", field="num_workers", value=0, reason="must be >= 1")
    assert render_error(workers, typed) == "--num-workers 0 is invalid: must be >= 1"
    sweep = build_parser().parse_args(["sweep", "--num-workers", "0"])
    assert render_error(workers, sweep) == "--num-workers 0 is invalid: must be >= 1"
    other = ConfigError(section="model", field="image_size", value=30, reason="r")
    assert render_error(other, typed) == str(other)
    assert render_error(UserInputError("unknown config field 'x'"), typed) == (
        "unknown config field 'x'"
    )


def test_an_options_error_names_the_flag_declared_on_its_field() -> None:
    """The flag comes from the option's dataclass field, as the user typed it (a positional's
    metavar, a flag that converts its value says so); a field of the same name in another
    section is not the option's."""
    prepare = build_parser().parse_args(["prepare", "x", "--out", "y", "--shard-mb", "0"])
    for field, shown in [
        ("num_workers", "--workers"),
        ("source", "SOURCE"),
        ("shard_max_bytes", "--shard-mb (in bytes)"),
    ]:
        error = ConfigError(section="prepare", field=field, value=0, reason="r")
        assert render_error(error, prepare) == f"{shown} 0 is invalid: r"
    args = ["sample", "--checkpoint", "c", "--num-samples", "1", "--out", "o"]
    sample = build_parser().parse_args(args)
    seed = ConfigError(section="sample", field="seed", value=-1, reason="must be >= 0")
    assert render_error(seed, sample) == "--seed -1 is invalid: must be >= 0"
    config_seed = ConfigError(section="train", field="seed", value=-1, reason="must be >= 0")
    assert render_error(config_seed, sample) == str(config_seed)


def test_every_option_of_every_command_is_a_field_of_its_options() -> None:
    """Each option is declared once: on a dataclass field whose metadata holds its flag and help
    (only --help, --verbose and --address, where a command runs, are the parser's own)."""
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # argparse keeps no public list
    parsers = dict(commands)
    evaluate = commands["evaluate"]._subparsers._group_actions[0].choices
    parsers.update({f"evaluate {name}": sub for name, sub in evaluate.items()})
    del parsers["evaluate"]
    assert set(parsers) == {
        *("prepare", "train", "train-classifier", "sweep", "sample", "ema", "family"),
        *("evaluate bpd", "evaluate fid", "evaluate accuracy"),
    }
    for name, sub in parsers.items():
        options_type = sub.get_default("options_type")
        fields = {f.name: f for f in dataclasses.fields(options_type)}
        for action in sub._actions:
            if action.dest in ("help", "address"):
                continue
            declared = fields[action.dest].metadata
            assert declared["help"] == action.help, name
            assert declared["flag"] in (*action.option_strings, action.metavar), name


def test_first_line_of_a_worker_traceback_is_the_raised_exception() -> None:
    from raydiff.errors import first_line

    worker = RuntimeError(
        "ray::RayTrainWorker._RayTrainWorker__execute() (pid=1, ip=127.0.0.1)\n"
        '  File "loop.py", line 3, in step\n'
        "    raise ValueError('loss is nan.')\n"
        "ValueError: loss is nan."
    )
    assert first_line(worker) == "ValueError: loss is nan"
    wrapped = RuntimeError("RayTaskError(ValueError): ray::f()\n  File 'x'\nValueError: boom")
    assert first_line(wrapped) == "ValueError: boom"


def test_first_line_of_a_plain_message_is_its_first_line() -> None:
    from raydiff.errors import first_line

    error = RuntimeError("\nWeights only load failed.\nSee the torch documentation for more.")
    assert first_line(error) == "Weights only load failed"
    assert first_line(KeyError()) == "KeyError"
    assert first_line(ValueError("x" * 300), limit=10) == "xxxxxxx..."
    # A later line that mentions an error without naming a raised one is not picked.
    assert first_line(OSError("disk full\nno Error here")) == "disk full"


def test_first_line_quotes_a_kept_message_by_the_same_rule() -> None:
    """A message kept as text (a trial's error, a failure compared across worker groups) is
    quoted as its exception would be; an empty one is empty."""
    from raydiff.errors import first_line

    trial = "Failure # 1\nTraceback (most recent call last):\n  File 'x'\nValueError: boom."
    assert first_line(trial) == first_line(RuntimeError(trial)) == "ValueError: boom"
    assert first_line("") == "" and first_line(" \n") == ""
