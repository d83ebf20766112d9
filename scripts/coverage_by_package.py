"""Line coverage per package of raydiff, from the coverage data `make test` collects.

    python scripts/coverage_by_package.py [--data-file .coverage]

Every module under raydiff/ counts, imported or not (one never imported counts as 0%). Only the
pytest processes are measured: code that runs in Ray's worker processes or in a CLI subprocess
is not (see docs/testing.md).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import coverage

ROOT = Path(__file__).resolve().parents[1]


def package_of(path: Path) -> str:
    """``raydiff.data`` for raydiff/data/pipeline.py, ``raydiff`` for raydiff/storage.py."""
    return ".".join(path.relative_to(ROOT).parent.parts)


def coverage_by_package(data_file: Path) -> dict[str, tuple[int, int]]:
    """``{package: (statements, missed)}`` for every package under raydiff/."""
    cov = coverage.Coverage(data_file=str(data_file))
    cov.load()
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for path in sorted((ROOT / "raydiff").rglob("*.py")):
        _, statements, _, missing, _ = cov.analysis2(str(path))
        totals[package_of(path)][0] += len(statements)
        totals[package_of(path)][1] += len(missing)
    return {package: (stmts, miss) for package, (stmts, miss) in sorted(totals.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-file", type=Path, default=ROOT / ".coverage")
    args = parser.parse_args()
    if not args.data_file.is_file():
        raise SystemExit(f"no coverage data at {args.data_file}: run `make test` first")
    rows = coverage_by_package(args.data_file)
    width = max(len(package) for package in rows)
    print(f"{'package':<{width}}  {'lines':>6}  {'missed':>6}  {'cover':>6}")
    for package, (stmts, miss) in rows.items():
        print(f"{package:<{width}}  {stmts:>6}  {miss:>6}  {_percent(stmts, miss):>6}")
    stmts, miss = (sum(column) for column in zip(*rows.values(), strict=True))
    print(f"{'total':<{width}}  {stmts:>6}  {miss:>6}  {_percent(stmts, miss):>6}")


def _percent(statements: int, missed: int) -> str:
    return f"{100 * (statements - missed) / statements:.0f}%" if statements else "-"


if __name__ == "__main__":
    main()
