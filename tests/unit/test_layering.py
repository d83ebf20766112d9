"""Layers point one way: the core loads nothing above it, and nothing below the Ray layer loads Ray.

Each check runs in a fresh interpreter, so modules imported by other tests cannot hide a leak.
"""

import json
import subprocess
import sys


def loaded_after(statement: str, watched: tuple[str, ...]) -> list[str]:
    """The ``watched`` modules (or their submodules) that ``statement`` loads."""
    code = (
        f"import json, sys; {statement}; "
        f"print(json.dumps(sorted({{m.split('.')[0] if not m.startswith('raydiff') else m "
        f"for m in sys.modules for w in {watched!r} if m == w or m.startswith(w + '.')}})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_core_loads_no_ray_data_or_config() -> None:
    watched = ("ray", "pyarrow", "PIL", "raydiff.config", "raydiff.data", "raydiff.train")
    assert loaded_after("import raydiff.core", watched) == []


def test_everything_below_the_ray_layer_loads_no_ray() -> None:
    below = (
        "raydiff.config, raydiff.config_doc, raydiff.data, raydiff.train.loop, "
        "raydiff.train.local, raydiff.cli, raydiff.evaluate.bpd, raydiff.evaluate.fid, "
        "raydiff.sample.classifier"
    )
    assert loaded_after(f"import {below}", ("ray",)) == []


def test_the_check_sees_a_leak() -> None:
    """The helper itself finds a module that is loaded (so the checks above can fail)."""
    assert loaded_after("import json, raydiff.config", ("raydiff.config",)) == ["raydiff.config"]
