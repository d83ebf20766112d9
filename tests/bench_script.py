"""A ``bench/`` script imported as a module, for the unit tests of its parts that need no GPU
and no reference checkout. Importable from every test module (``tests/`` is on ``sys.path``)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench_script(name: str) -> types.ModuleType:
    """``bench/NAME.py`` as the module ``NAME`` (registered first, so the scripts that import
    one another, as ``sampling_gpu`` imports ``gpu_step``, share one copy)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module
