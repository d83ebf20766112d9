"""Parquet shards of PNG bytes: a bounded-size writer and the schema the pipeline reads."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# key: where the image came from; label: class id (-1 when the dataset has no labels);
# index: row number within the split (stable id that seeds the per-row flip); png: the image.
SHARD_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string()),
        pa.field("label", pa.int64()),
        pa.field("index", pa.int64()),
        pa.field("png", pa.binary()),
    ]
)
NO_LABEL = -1


@dataclass(frozen=True)
class ShardInfo:
    """One finished shard, as recorded in the manifest."""

    path: str  # relative to the dataset root, always with "/"
    num_rows: int
    num_bytes: int
    sha256: str


class ShardWriter:
    """Buffers rows of one split and writes a shard whenever a size bound is reached.

    Each shard is written under a temporary name and renamed, so a shard file that exists is
    complete. (The whole dataset folder is itself renamed into place at the end of prepare.)
    """

    def __init__(
        self, *, root: Path, split: str, max_rows: int, max_bytes: int, row_group_rows: int
    ) -> None:
        # The bounds are PrepareOptions', checked there (each >= 1).
        self._root = root
        self._split = split
        self._max_rows = max_rows
        self._max_bytes = max_bytes
        self._row_group_rows = row_group_rows
        self._rows: list[tuple[str, int, int, bytes]] = []  # key, label, index, png
        self._buffered_bytes = 0
        self.num_rows = 0
        """Rows written or buffered so far."""
        self.shards: list[ShardInfo] = []
        (root / split).mkdir(parents=True, exist_ok=True)

    def add(self, *, key: str, label: int, png: bytes) -> None:
        """Append one image; flushes a shard when it would exceed a bound."""
        if self._rows and (
            len(self._rows) >= self._max_rows or self._buffered_bytes + len(png) > self._max_bytes
        ):
            self.flush()
        self._rows.append((key, label, self.num_rows, png))
        self._buffered_bytes += len(png)
        self.num_rows += 1

    def flush(self) -> None:
        """Write the buffered rows (if any) as one shard."""
        if not self._rows:
            return
        columns = zip(SHARD_SCHEMA.names, zip(*self._rows, strict=True), strict=True)
        table = pa.table(dict(columns), schema=SHARD_SCHEMA)
        relative = f"{self._split}/part-{len(self.shards):05d}.parquet"
        final = self._root / relative
        temporary = final.with_name(final.name + ".tmp")
        # PNG bytes are already deflated: a second codec only costs time.
        pq.write_table(table, temporary, compression="none", row_group_size=self._row_group_rows)
        os.replace(temporary, final)
        self.shards.append(
            ShardInfo(
                path=relative,
                num_rows=table.num_rows,
                num_bytes=final.stat().st_size,
                sha256=file_sha256(final),
            )
        )
        self._rows, self._buffered_bytes = [], 0


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(1 << 20):
            digest.update(piece)
    return digest.hexdigest()
