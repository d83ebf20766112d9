"""Functions short enough to read at once: none in raydiff/ runs over 80 lines, but in the modules
of core/ that mirror improved-diffusion's and guided-diffusion's (whose functions keep the
originals' shape, so that they read side by side)."""

from __future__ import annotations

import ast
from pathlib import Path

RAYDIFF = Path(__file__).resolve().parents[2] / "raydiff"
MAX_LINES = 80
MIRRORS = frozenset(
    {
        "gaussian_diffusion.py",  # gaussian_diffusion.py
        "respace.py",  # respace.py
        "unet.py",  # unet.py
        "nn_layers.py",  # nn.py
        "losses.py",  # losses.py
        "schedules.py",  # gaussian_diffusion.py's get_named_beta_schedule
        "timestep_sampler.py",  # resample.py
    }
)
"""The modules of ``core/`` that mirror one of the originals' (named beside each)."""


def long_functions(root: Path, *, limit: int) -> list[str]:
    """``path:name (N lines)`` of every function or method under ``root`` longer than ``limit``,
    the :data:`MIRRORS` of ``core/`` excepted."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if "core" in path.relative_to(root).parts and path.name in MIRRORS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.name} ({lines} lines)")
    return found


def test_no_function_outside_the_mirrors_of_the_originals_is_over_80_lines() -> None:
    assert long_functions(RAYDIFF, limit=MAX_LINES) == []


def test_the_check_sees_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n")
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "unet.py").write_text(f"def long():\n{body}\n")
    (tmp_path / "core" / "own.py").write_text(f"def long():\n{body}\n")
    assert long_functions(tmp_path, limit=MAX_LINES) == [
        f"{tmp_path.name}/core/own.py:long (81 lines)",
        f"{tmp_path.name}/long.py:long (81 lines)",
    ]
