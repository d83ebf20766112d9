"""Layers point one way: the core loads nothing above it, and nothing below the Ray layer loads Ray.

Each check runs in a fresh interpreter, so modules imported by other tests cannot hide a leak.
"""

import functools
import json
import subprocess
import sys
from pathlib import Path


def loaded_after(*steps: tuple[str, tuple[str, ...]]) -> list[list[str]]:
    """For each ``(statement, watched)`` in turn, in one fresh interpreter: the ``watched``
    modules (or their submodules) loaded once ``statement`` (and the steps before it) ran."""
    code = "import json, sys\n"
    for statement, watched in steps:
        code += (
            f"{statement}\n"
            f"print(json.dumps(sorted({{m.split('.')[0] if not m.startswith('raydiff') else m "
            f"for m in sys.modules for w in {watched!r} if m == w or m.startswith(w + '.')}})))\n"
        )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [json.loads(line) for line in out.stdout.strip().splitlines()[-len(steps) :]]


PACKAGE = Path(__file__).resolve().parents[2] / "raydiff"
RAY_LAYER = ("raydiff.orchestrate",)
"""The only package that imports Ray's libraries at import time; the CLI above it imports Ray
when a command runs (``raydiff --help`` and a config error do not wait for Ray)."""


def modules_below_the_ray_layer() -> list[str]:
    """Every module of the package outside the Ray layer, found by listing its files (a new
    module or package is covered without being named here); ``__main__`` modules run a command
    when imported and are left out."""
    names = []
    for file in sorted(PACKAGE.rglob("*.py")):
        parts = file.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if parts[-1] != "__main__" and not any(
            name == layer or name.startswith(layer + ".") for layer in RAY_LAYER
        ):
            names.append(name)
    return names


@functools.cache
def layers() -> tuple[list[str], list[str]]:
    """One interpreter (an import of torch costs seconds): what the core loads, then what
    everything below the Ray layer loads on top of it."""
    core, below = loaded_after(
        (
            "import raydiff.core",
            ("ray", "pyarrow", "PIL", "raydiff.config", "raydiff.data", "raydiff.train"),
        ),
        (f"import {', '.join(modules_below_the_ray_layer())}", ("ray",)),
    )
    return core, below


def test_the_core_loads_no_ray_data_or_config() -> None:
    assert layers()[0] == []


def test_everything_below_the_ray_layer_loads_no_ray() -> None:
    assert layers()[1] == []


def test_the_listing_finds_every_module_outside_the_ray_layer() -> None:
    listed = modules_below_the_ray_layer()
    for module in ("raydiff", "raydiff.storage", "raydiff.cli.app", "raydiff.train.loop"):
        assert module in listed
    assert "raydiff.data" in listed and "raydiff.train.tasks.classifier" in listed
    assert not [m for m in listed if m.startswith("raydiff.orchestrate") or "__main__" in m]
    assert len(listed) == len(
        [f for f in PACKAGE.rglob("*.py") if "orchestrate" not in f.parts and f.stem != "__main__"]
    )


def test_the_check_sees_a_leak() -> None:
    """The helper itself finds a module that is loaded (so the checks above can fail), also in
    a later step."""
    assert loaded_after(
        ("import json", ("raydiff.errors",)), ("import raydiff.errors", ("raydiff.errors",))
    ) == [[], ["raydiff.errors"]]


def test_the_drivers_ray_modules_import_no_torch() -> None:
    """A run's driver and a sweep's trial check the run before they start anything: the modules
    they load for that import no torch (seconds to import); Ray Train's TorchTrainer brings it
    once the checks have passed."""
    [loaded] = loaded_after(
        (
            "import raydiff.orchestrate.training_job, raydiff.orchestrate.worker, "
            "raydiff.orchestrate.sweep, raydiff.orchestrate.ray_session, "
            "raydiff.train.checkpoint",
            ("torch",),
        )
    )
    assert loaded == []


def test_validating_a_config_imports_no_torch() -> None:
    """The CLI's config errors, a sweep's trial and its Ray Train controller build and validate
    configs, the UNet architecture rules included (raydiff.core.unet_arguments), without torch;
    the model classes still come from raydiff.core on first use."""
    validated, model = loaded_after(
        ("from raydiff.config import load_config\nload_config('demo')", ("torch",)),
        ("from raydiff.core import UNetModel", ("torch",)),
    )
    assert validated == []
    assert model == ["torch"]
