"""``python jobs/family.py FILE --output DIR [...]``: the same as ``raydiff family``."""

from __future__ import annotations

import sys

from raydiff.cli import main

if __name__ == "__main__":
    sys.exit(main(["family", *sys.argv[1:]]))
