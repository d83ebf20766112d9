"""``python jobs/evaluate.py bpd|fid ...``: the same as ``raydiff evaluate``.

``python jobs/evaluate.py bpd --checkpoint runs/demo/checkpoint_000450 --num-images 64`` reports
the demo model's bits/dim on the Fashion-MNIST test split.
"""

from __future__ import annotations

import sys

from raydiff.cli import main

if __name__ == "__main__":
    sys.exit(main(["evaluate", *sys.argv[1:]]))
