"""One path type: a local folder and a URI are both a ``raydiff.storage.StoragePath``, and only
raydiff/storage.py decides which one a path or a name is. Elsewhere nothing checks
``isinstance(..., RemotePath)``, spells the union ``Path | RemotePath`` again, looks for
``"://"`` in a name or calls ``is_remote`` / ``is_local``: the branch goes into a storage function
(``local_path``, ``resolved``, ``ray_storage``, ``append_line``, ...) that every caller shares."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("raydiff", "bench", "jobs")
STORAGE = Path("raydiff") / "storage.py"
UNION = re.compile(r"\bPath\s*\|\s*RemotePath\b|\bRemotePath\s*\|\s*Path\b")


def _names(node: ast.AST) -> set[str]:
    """Every name (``RemotePath``, ``storage.RemotePath``'s attribute) inside ``node``."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
    return found


# storage.py's own tests: is_remote(text) is its rule, is_local was its earlier name for one.
STORAGE_TESTS = frozenset({"is_remote", "is_local"})


def _storage_decision(node: ast.AST) -> str | None:
    """What ``node`` is, when it decides local or URI outside storage.py."""
    if isinstance(node, ast.Constant) and node.value == "://":
        return '"://"'
    if isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name in STORAGE_TESTS:
            return f"{name}(...)"
        if name == "isinstance" and len(node.args) == 2 and "RemotePath" in _names(node.args[1]):
            return "isinstance(..., RemotePath)"
    return None


def path_type_checks(root: Path) -> list[str]:
    """``file:line what`` for each ``isinstance(..., RemotePath)``, ``Path | RemotePath``,
    ``"://"`` and call of ``is_remote`` or ``is_local`` in the Python files under ``root``'s
    scanned folders, storage.py excepted."""
    found = []
    for folder in SCANNED:
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root)
            if relative == STORAGE:
                continue
            text = path.read_text()
            spotted = [
                (number, "Path | RemotePath")
                for number, line in enumerate(text.splitlines(), start=1)
                if UNION.search(line)
            ]
            for node in ast.walk(ast.parse(text, filename=str(path))):
                if what := _storage_decision(node):
                    spotted.append((node.lineno, what))
            found += [f"{relative}:{number} {what}" for number, what in sorted(spotted)]
    return found


def test_only_storage_asks_whether_a_path_is_remote() -> None:
    assert path_type_checks(ROOT) == []


def test_the_check_sees_each_spelling(tmp_path: Path) -> None:
    module = Path("raydiff", "train", "mod.py")  # no such module in the project
    (tmp_path / module.parent).mkdir(parents=True)
    (tmp_path / "jobs").mkdir()
    (tmp_path / module).write_text(
        "def f(p: Path | RemotePath, q: RemotePath|Path) -> None:\n"
        "    if isinstance(p, storage.RemotePath):\n"
        "        pass\n"
        "    if isinstance(\n        q, (Path, RemotePath)\n    ):\n"
        "        pass\n"
    )
    job = Path("jobs", "job.py")
    (tmp_path / job).write_text(
        "ok = isinstance(x, Path)\nx: StoragePath\nurl = 'https://example.org'\n"
        "if '://' in name or storage.is_remote(name) or is_local(x):\n    pass\n"
    )
    storage = "x: Path | RemotePath\nisinstance(x, RemotePath)\nis_remote('://')\n"
    (tmp_path / STORAGE).write_text(storage)  # the one module that may
    assert path_type_checks(tmp_path) == [
        f"{module}:1 Path | RemotePath",
        f"{module}:2 isinstance(..., RemotePath)",
        f"{module}:4 isinstance(..., RemotePath)",
        f'{job}:4 "://"',
        f"{job}:4 is_local(...)",
        f"{job}:4 is_remote(...)",
    ]
