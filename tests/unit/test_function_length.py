"""Functions short enough to read at once: none in raydiff/ outside core/ (whose modules mirror
improved-diffusion's) runs over 80 lines."""

from __future__ import annotations

import ast
from pathlib import Path

RAYDIFF = Path(__file__).resolve().parents[2] / "raydiff"
MAX_LINES = 80


def long_functions(root: Path, *, limit: int) -> list[str]:
    """``path:name (N lines)`` of every function or method under ``root`` longer than ``limit``,
    ``core/`` excepted."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if "core" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.name} ({lines} lines)")
    return found


def test_no_function_outside_core_is_over_80_lines() -> None:
    assert long_functions(RAYDIFF, limit=MAX_LINES) == []


def test_the_check_sees_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n")
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "mirror.py").write_text(f"def long():\n{body}\n")
    assert long_functions(tmp_path, limit=MAX_LINES) == [f"{tmp_path.name}/long.py:long (81 lines)"]
