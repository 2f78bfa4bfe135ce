"""Documents in the repository: Parquet parts under ``<folder>/<source>/part-NNNNN.parquet``
(:mod:`formats.layout`), written in a stream and read back one part at a time."""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from formats import layout
from versioning import DataRepo, validate_path


class PartWriter:
    """Writes a stream of Arrow tables as ``<prefix>/part-NNNNN.parquet`` of about ``rows_per_part`` rows."""

    def __init__(self, repo: DataRepo, branch: str, prefix: str, rows_per_part: int = 50_000):
        self.repo = repo
        self.branch = branch
        self.prefix = validate_path(prefix.rstrip("/"))
        self.rows_per_part = rows_per_part
        self.paths: list[str] = []
        self.rows = 0
        self._pending: list[pa.Table] = []
        self._pending_rows = 0

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        self._pending.append(table)
        self._pending_rows += table.num_rows
        while self._pending_rows >= self.rows_per_part:
            merged = pa.concat_tables(self._pending, promote_options="default")
            self._flush(merged.slice(0, self.rows_per_part))
            rest = merged.slice(self.rows_per_part)
            self._pending = [rest] if rest.num_rows else []
            self._pending_rows = rest.num_rows

    def close(self) -> list[str]:
        if self._pending_rows:
            self._flush(pa.concat_tables(self._pending, promote_options="default"))
        self._pending, self._pending_rows = [], 0
        return self.paths

    def _flush(self, table: pa.Table) -> None:
        path = f"{self.prefix}/{layout.part_name(len(self.paths))}"
        put_table(self.repo, self.branch, path, table)
        self.paths.append(path)
        self.rows += table.num_rows

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()


def put_table(repo: DataRepo, branch: str, path: str, table: pa.Table) -> None:
    """Write ``table`` as one zstd Parquet object at ``path`` (through a local temporary file)."""
    with tempfile.NamedTemporaryFile(suffix=".parquet", delete=False) as tmp:
        tmp_path = tmp.name
    try:
        pq.write_table(table.combine_chunks(), tmp_path, compression="zstd")
        repo.put(branch, validate_path(path), tmp_path)
    finally:
        os.unlink(tmp_path)


def list_parts(repo: DataRepo, ref: str, prefix: str) -> list[str]:
    return [o.path for o in repo.list(ref, prefix.rstrip("/") + "/") if o.path.endswith(".parquet")]


def read_parts(repo: DataRepo, ref: str, prefix: str, columns: list[str] | None = None) -> Iterator[pa.Table]:
    """Each Parquet part under ``prefix`` at ``ref``, in path order (one part in memory at a time)."""
    for path in list_parts(repo, ref, prefix):
        yield read_part(repo, ref, path, columns)


def read_part(repo: DataRepo, ref: str, path: str, columns: list[str] | None = None) -> pa.Table:
    with repo.open(ref, path) as f:
        data = f.read()
    return pq.read_table(pa.BufferReader(data), columns=columns)


def read_part_in_row_groups(
    repo: DataRepo, ref: str, path: str, columns: list[str] | None = None
) -> Iterator[pa.Table]:
    """A Parquet part one row group at a time (ranged reads; never the whole object in memory)."""
    with repo.open(ref, path) as f, pq.ParquetFile(f) as parquet:
        for group in range(parquet.num_row_groups):
            yield parquet.read_row_group(group, columns=columns)


def list_sources(repo: DataRepo, ref: str, prefix: str) -> list[str]:
    """The ``<source>`` folder names directly under ``prefix``."""
    base = prefix.rstrip("/") + "/"
    names = {o.path[len(base) :].split("/", 1)[0] for o in repo.list(ref, base)}
    return sorted(n for n in names if n)


def clear_prefix(repo: DataRepo, branch: str, prefix: str) -> int:
    """Stage the removal of everything under ``prefix``; returns how many objects."""
    paths = [o.path for o in repo.list(branch, prefix.rstrip("/") + "/")]
    for path in paths:
        repo.delete(branch, path)
    return len(paths)


def put_json(repo: DataRepo, branch: str, path: str, obj: Any) -> None:
    data = json.dumps(obj, indent=2, sort_keys=True, default=str).encode()
    repo.put(branch, path, io.BytesIO(data))


def iter_batches(tables: Iterable[pa.Table], batch_rows: int) -> Iterator[pa.Table]:
    """Re-chunk a stream of tables into tables of at most ``batch_rows`` rows."""
    for table in tables:
        for start in range(0, table.num_rows, batch_rows):
            yield table.slice(start, batch_rows)
