"""``python jobs/prepare.py SOURCE --out DIR [...]``: the same as ``raydiff prepare``."""

from __future__ import annotations

import sys

from raydiff.cli import main

if __name__ == "__main__":
    sys.exit(main(["prepare", *sys.argv[1:]]))
