"""``python jobs/train.py [...]``: the same as ``raydiff train``.

With no arguments it trains the embedded demo (Fashion-MNIST, configs/demo.yaml), preparing the
dataset first when it is missing.
"""

from __future__ import annotations

import sys

from raydiff.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
