"""``python jobs/train_classifier.py [...]``: the same as ``raydiff train-classifier``.

With no arguments it trains the noisy classifier of the embedded demo (Fashion-MNIST,
configs/classifier_demo.yaml), preparing the dataset first when it is missing.
"""

from __future__ import annotations

import sys

from raydiff.cli import main

if __name__ == "__main__":
    sys.exit(main(["train-classifier", *sys.argv[1:]]))
