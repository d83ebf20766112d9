"""``python -m raydiff.cli SUBCOMMAND ...``: the same as ``raydiff SUBCOMMAND ...``."""

import sys

from raydiff.cli.app import main

sys.exit(main())
