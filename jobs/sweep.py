"""``python jobs/sweep.py --config SWEEP.yaml --output DIR [...]``: the same as ``raydiff sweep``.

``python jobs/sweep.py --config configs/sweep_demo.yaml --output runs/sweep_demo`` compares the
demo model's noise schedules and learning rates on Fashion-MNIST.
"""

from __future__ import annotations

import sys

from raydiff.cli import main

if __name__ == "__main__":
    sys.exit(main(["sweep", *sys.argv[1:]]))
