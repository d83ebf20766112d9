"""Ray stays at the edge: the core imports no Ray."""

import subprocess
import sys


def test_core_train_and_config_import_without_ray():
    code = (
        "import sys, raydiff.core, raydiff.config, raydiff.train.loop, raydiff.data.in_memory; "
        "bad = [m for m in sys.modules if m == 'ray' or m.startswith('ray.')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
