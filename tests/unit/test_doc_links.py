"""Every file the project's text refers to is in the project, and the README stays short.

Two checks over the repository's own text files (run folders, datasets, virtualenvs and caches
are skipped):
- every relative link of a Markdown file (``[text](path#anchor)``) reaches a file or folder, and
  its anchor, if any, is a heading of that Markdown file (GitHub's heading ids);
- every project path named anywhere in text (``docs/x.md``, ``bench/x.py``, ``configs/x.yaml``,
  ``tests/...``, ``raydiff/...``, ``jobs/...``, ``scripts/...``) exists. Placeholders in capitals
  (``configs/NAME.yaml``), globs that match something, benchmark outputs (``bench/results/``)
  and another project's files (``improved-diffusion's scripts/image_train.py``) are not paths of
  this project.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
README_MAX_CHARS = 10_000

TEXT_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".toml", ".sh", ".cfg", ".txt", ".ini"}
TEXT_NAMES = {"Makefile", "run"}  # .ci/run
SKIPPED_DIRS = {"runs", "data", "build", "dist", "node_modules", "__pycache__"}
KEPT_DOT_DIRS = {".ci"}

PROJECT_PATH = re.compile(
    r"(?<![\w./~-])(?P<path>(?:docs|bench|configs|tests|raydiff|jobs|scripts)/[\w./*-]*[\w*])"
)
MARKDOWN_LINK = re.compile(r"(?<!!)\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
# A section named after its page in prose or a comment: docs/operations.md, "CPUs for Ray Data".
NAMED_SECTION = re.compile(r"(?P<page>docs/[\w-]+\.md),? \"(?P<section>[^\"]+)\"")


def text_files() -> list[Path]:
    """The repository's text files, without what runs and set-up leave in the checkout (the
    walk never enters a virtualenv, a dataset or a run folder)."""
    found = []
    for folder, subfolders, names in os.walk(ROOT):
        here = Path(folder)
        subfolders[:] = sorted(
            name
            for name in subfolders
            if name not in SKIPPED_DIRS
            and not name.endswith(".egg-info")
            and (not name.startswith(".") or name in KEPT_DOT_DIRS)
            and (here / name).relative_to(ROOT).parts != ("bench", "results")
        )
        for name in sorted(names):
            path = here / name
            if path.suffix in TEXT_SUFFIXES or name in TEXT_NAMES:
                found.append(path)
    return found


def markdown_files() -> list[Path]:
    return [path for path in text_files() if path.suffix == ".md"]


def slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def heading_ids(markdown: Path) -> set[str]:
    """GitHub's ids of a Markdown file's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated id numbered -1, -2, ...; headings inside code fences do not count."""
    ids: set[str] = set()
    seen: dict[str, int] = {}
    in_fence = False
    for line in markdown.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if in_fence or not match:
            continue
        heading = slug(match.group(1))
        count = seen.get(heading, 0)
        seen[heading] = count + 1
        ids.add(heading if count == 0 else f"{heading}-{count}")
    return ids


def shown(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def broken_links(markdown: Path) -> list[str]:
    problems = []
    text = markdown.read_text(encoding="utf-8")
    for match in MARKDOWN_LINK.finditer(text):
        target = match.group("target")
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, s3: ...
            continue
        path_part, _, anchor = target.partition("#")
        linked = (markdown.parent / path_part).resolve() if path_part else markdown
        if not linked.exists():
            problems.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in heading_ids(linked):
            problems.append(f"{target}: no heading #{anchor} in {shown(linked)}")
    return problems


def is_project_path(text: str, start: int, path: str) -> bool:
    if re.search(r"[A-Z]{2,}", path) or path.startswith("bench/results"):
        return False
    return not text[max(0, start - 3) : start].endswith("'s ")


def missing_sections(file: Path) -> list[str]:
    text = file.read_text(encoding="utf-8", errors="replace")
    missing = []
    for match in NAMED_SECTION.finditer(text):
        page = ROOT / match.group("page")
        if page.exists() and slug(match.group("section")) not in heading_ids(page):
            missing.append(
                f'{shown(file)}: {match.group("page")} has no section "{match.group("section")}"'
            )
    return missing


def missing_paths(file: Path) -> list[str]:
    text = file.read_text(encoding="utf-8", errors="replace")
    missing = []
    for match in PROJECT_PATH.finditer(text):
        path = match.group("path").rstrip(".")
        if not is_project_path(text, match.start(), path):
            continue
        exists = any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()
        if not exists:
            line = text.count("\n", 0, match.start()) + 1
            missing.append(f"{shown(file)}:{line}: {path}")
    return missing


def test_the_checks_see_the_docs() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in markdown_files()}
    assert {"README.md", "docs/architecture.md", "docs/performance.md"} <= names


def test_heading_ids_follow_github() -> None:
    ids = heading_ids(ROOT / "docs" / "performance.md")
    assert "start-up-of-one-ray-train-run-benchtrain_startuppy" in ids


@pytest.mark.parametrize(
    "markdown", markdown_files(), ids=lambda path: path.relative_to(ROOT).as_posix()
)
def test_markdown_links_reach_files_and_headings(markdown: Path) -> None:
    assert broken_links(markdown) == []


def test_project_paths_named_in_text_exist() -> None:
    # This file names missing paths on purpose, as examples.
    files = [file for file in text_files() if file != Path(__file__).resolve()]
    missing = [entry for file in files for entry in missing_paths(file)]
    assert missing == [], "paths the project does not contain:\n" + "\n".join(missing)


def test_sections_named_in_text_exist() -> None:
    files = [file for file in text_files() if file != Path(__file__).resolve()]
    missing = [entry for file in files for entry in missing_sections(file)]
    assert missing == [], "sections the docs do not have:\n" + "\n".join(missing)


def test_a_broken_link_and_a_missing_path_are_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A title\n[a](nothing.md) [b](#a-title) [c](#other) [d](https://example.com)\n"
        "See docs/nothing.md, configs/NAME.yaml, docs/*.md and improved-diffusion's "
        "scripts/image_train.py.\n"
        'docs/operations.md, "Storage"; docs/operations.md "No such section".\n',
        encoding="utf-8",
    )
    assert broken_links(page) == [
        "nothing.md: no such file",
        f"#other: no heading #other in {page}",
    ]
    assert missing_paths(page) == [f"{page}:3: docs/nothing.md"]
    assert missing_sections(page) == [
        f'{page}: docs/operations.md has no section "No such section"'
    ]


def test_readme_is_at_most_10000_characters() -> None:
    size = len((ROOT / "README.md").read_text(encoding="utf-8"))
    assert size <= README_MAX_CHARS, f"README.md has {size} characters (at most {README_MAX_CHARS})"
