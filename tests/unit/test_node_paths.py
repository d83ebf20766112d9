"""What a node "sees" at a local path (raydiff.orchestrate.node_paths.fingerprint), the value
that every node must agree on with the driver. The refusal itself needs nodes that share no
disk: the cluster tier's."""

from __future__ import annotations

from pathlib import Path

from raydiff.orchestrate.node_paths import fingerprint


def test_a_missing_path_is_none_and_a_file_is_its_size_and_content(tmp_path: Path) -> None:
    assert fingerprint(str(tmp_path / "missing")) is None
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"x" * 10)
    b.write_bytes(b"x" * 10)
    assert fingerprint(str(a)) == fingerprint(str(b))  # the same bytes: the same file here
    b.write_bytes(b"x" * 9 + b"y")
    assert fingerprint(str(a)) != fingerprint(str(b))  # same size, other content


def test_a_folder_is_its_top_level_names_kinds_and_sizes(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    for folder in (one, two):
        (folder / "shards").mkdir(parents=True)
        (folder / "manifest.json").write_text("{}")
    assert fingerprint(str(one)) == fingerprint(str(two))
    (two / "manifest.json").write_text('{"a": 1}')
    assert fingerprint(str(one)) != fingerprint(str(two))
    assert fingerprint(str(tmp_path / "empty")) is None
    (tmp_path / "empty").mkdir()
    assert fingerprint(str(tmp_path / "empty")) != fingerprint(str(one))
