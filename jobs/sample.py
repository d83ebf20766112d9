"""``python jobs/sample.py --checkpoint CKPT --num-samples N --out DIR [...]``: the same as ``raydiff sample``.

``python jobs/sample.py --checkpoint runs/demo/checkpoint_000450 --num-samples 64 --out runs/samples``
samples the demo model.
"""

from __future__ import annotations

import sys

from raydiff.cli import main

if __name__ == "__main__":
    sys.exit(main(["sample", *sys.argv[1:]]))
