"""Turn ``pip config list`` (stdin) into the matching ``uv pip install`` arguments, one per line.

uv does not read pip's configuration files or ``PIP_*`` variables; scripts/setup.sh passes it
the settings that decide where packages come from: index URLs, wheel folders and constraints.
"""

from __future__ import annotations

import shlex
import sys

FLAGS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}


def uv_arguments(lines: list[str]) -> list[str]:
    """``global.find-links='/a /b'`` -> ``--find-links /a --find-links /b``; each value once."""
    arguments: list[str] = []
    seen: set[tuple[str, str]] = set()
    for line in lines:
        key, _, quoted = line.strip().partition("=")
        flag = FLAGS.get(key.rsplit(".", 1)[-1])
        if flag is None or not quoted:
            continue
        for value in " ".join(shlex.split(quoted)).split():  # pip's lists are space-separated
            if (flag, value) not in seen:
                seen.add((flag, value))
                arguments += [flag, value]
    return arguments


if __name__ == "__main__":
    print("\n".join(uv_arguments(sys.stdin.readlines())))
