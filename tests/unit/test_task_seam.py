"""The task is the system's seam: outside ``raydiff/train/tasks/`` and ``raydiff/config/`` no
module compares a task's name with a literal (it asks the task's spec instead), and every task
the config offers has a spec whose metrics are declared once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

RAYDIFF = Path(__file__).resolve().parents[2] / "raydiff"
ALLOWED = ("train/tasks", "config")


def _names_a_task(node: ast.expr) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name == "task" or name.endswith("_task")


def task_name_comparisons(root: Path) -> list[str]:
    """``path:line`` of every ``task == "..."`` / ``!=`` / ``in (...)`` with a string literal
    under ``root``, the allowed packages excepted."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(ALLOWED):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            literal = any(
                (isinstance(s, ast.Constant) and isinstance(s.value, str))
                or isinstance(s, ast.Tuple | ast.List | ast.Set)
                for s in sides
            )
            if literal and any(_names_a_task(s) for s in sides):
                found.append(f"{relative}:{node.lineno}")
    return found


def test_no_module_outside_the_tasks_and_the_config_compares_a_task_name() -> None:
    assert task_name_comparisons(RAYDIFF) == []


def test_the_check_sees_a_comparison(tmp_path: Path) -> None:
    (tmp_path / "sample").mkdir()
    (tmp_path / "sample" / "load.py").write_text(
        'if config.train.task == "classifier":\n    pass\nupsampler = task in ("super_res",)\n'
    )
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "experiment.py").write_text('ok = train.task == "classifier"\n')
    assert task_name_comparisons(tmp_path) == ["sample/load.py:1", "sample/load.py:3"]


@pytest.mark.parametrize("name", ["diffusion", "classifier", "super_res"])
def test_every_task_declares_its_metrics_once(name: str) -> None:
    from raydiff.train.task import LOOP_METRICS
    from raydiff.train.tasks import task_spec

    spec = task_spec(name)
    keys = [m.key for m in spec.all_metrics()]
    assert len(keys) == len(set(keys)), keys
    assert spec.objectives and all(spec.metric(k).objective for k in spec.objectives)
    gauges = [m.gauge for m in spec.all_metrics() if m.gauge]
    assert len(gauges) == len(set(gauges))
    assert {m.key for m in LOOP_METRICS} <= set(keys)


def test_an_unknown_task_is_refused_naming_the_valid_ones() -> None:
    from raydiff.errors import UserInputError
    from raydiff.train.tasks import task_spec

    with pytest.raises(UserInputError, match=r"unknown task 'gan'; valid: classifier, diffusion"):
        task_spec("gan")
