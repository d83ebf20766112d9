"""``python jobs/ema.py --run RUN --sigma-rel 0.05,0.10 [...]``: the same as ``raydiff ema``."""

from __future__ import annotations

import sys

from raydiff.cli import main

if __name__ == "__main__":
    sys.exit(main(["ema", *sys.argv[1:]]))
