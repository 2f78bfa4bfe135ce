"""What the steps of the dedup shuffle share: the run, its items, the scratch files' schemas."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tasks.dedup.config import DedupConfig
from tasks.dedup.index import PublishedRun
from tasks.dedup.plan import REQUIRED_COLUMNS, _byte_batches
from tasks.dedup.shingles import content_keys
from tasks.parts import list_parts, put_table, read_part
from versioning import DataRepo

KEY = pa.binary(16)


@dataclass(frozen=True)
class ShuffleRun:
    """What every step of one dedup run needs; travels to the workers with each item."""

    repo: DataRepo
    branch: str
    input_commit: str
    config: DedupConfig
    scratch: str
    index_run: str
    published: tuple[PublishedRun, ...]

    @property
    def buckets(self) -> int:
        return self.config.buckets

    def at(self, step: str, bucket: int, producer: str | None = None) -> str:
        """``<scratch>/<step>/b<bucket>[/<producer>].parquet``: what ``producer`` wrote for ``bucket``."""
        folder = f"{self.scratch}/{step}/b{bucket:05d}"
        return f"{folder}/{producer}.parquet" if producer is not None else folder

    def put(self, path: str, table: pa.Table) -> None:
        if table.num_rows:
            put_table(self.repo, self.branch, path, table)

    def read(self, folder: str, schema: pa.Schema) -> pa.Table:
        """Every file under a scratch folder of the branch, in path order (empty: ``schema``)."""
        tables = [read_part(self.repo, self.branch, p) for p in list_parts(self.repo, self.branch, folder)]
        return pa.concat_tables(tables).cast(schema) if tables else schema.empty_table()

    def scatter(self, step: str, table: pa.Table, bucket: np.ndarray, producer: str) -> None:
        """Write the rows of ``table`` to the bucket each belongs to (one file per non-empty bucket)."""
        order = np.argsort(bucket, kind="stable")
        ordered, table = bucket[order], table.take(pa.array(order))
        bounds = np.flatnonzero(np.diff(ordered)) + 1
        for start, stop in zip(np.r_[0, bounds], np.r_[bounds, len(ordered)], strict=True):
            if stop > start:
                self.put(self.at(step, int(ordered[start]), producer), table.slice(start, stop - start))


@dataclass(frozen=True)
class Part:
    """One input part: its index in the run's order, its path and source."""

    run: ShuffleRun
    index: int
    path: str
    source: str

    @property
    def producer(self) -> str:
        return f"p{self.index:06d}"


@dataclass(frozen=True)
class Bucket:
    run: ShuffleRun
    bucket: int

    @property
    def producer(self) -> str:
        return f"b{self.bucket:05d}"


ROWS = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("content_key", KEY),
        ("quality", pa.float64()),
        ("part", pa.int32()),
        ("row", pa.int32()),
    ]
)
NEEDS = pa.schema([("content_key", KEY), ("part", pa.int32())])
DOCS = pa.schema([*ROWS, ("published", pa.bool_())])
PAIRS = pa.schema([("a", KEY), ("b", KEY)])
EDGES = pa.schema([("a", KEY), ("b", KEY)])
LABELS = pa.schema([("content_key", KEY), ("label", KEY)])
PARTIALS = pa.schema(
    [
        ("label", KEY),
        ("id", pa.string()),
        ("published", pa.bool_()),
        ("quality", pa.float64()),
        ("count", pa.int64()),
    ]
)
REPRESENTATIVES = pa.schema([("content_key", KEY), ("representative", pa.string()), ("size", pa.int64())])
DECISIONS = pa.schema(
    [
        ("row", pa.int32()),
        ("dup_cluster", pa.string()),
        ("cluster_size", pa.int64()),
        ("weight", pa.float64()),
        ("removed", pa.bool_()),
        ("reason", pa.string()),
        ("duplicate_of", pa.string()),
    ]
)


def signature_schema(num_perm: int) -> pa.Schema:
    return pa.schema([("content_key", KEY), ("signature", pa.list_(pa.uint32(), num_perm))])


def band_schema() -> pa.Schema:
    return pa.schema([("band", pa.int32()), ("key", pa.uint64()), ("content_key", KEY)])


def signature_array(signature: np.ndarray) -> pa.Array:
    return pa.FixedSizeListArray.from_arrays(pa.array(signature.reshape(-1), pa.uint32()), signature.shape[1])


def matrix(column: pa.ChunkedArray | pa.Array, width: int) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), width)


def read_input(part: Part) -> pa.Table:
    table = read_part(part.run.repo, part.run.input_commit, part.path)
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(
            f"an input part lacks column(s) {', '.join(missing)}; dedup reads the filtered stage"
        )
    return table


def batch_content_keys(texts: pa.Array, batch_bytes: int) -> np.ndarray:
    batches = [content_keys(texts.slice(a, b - a)) for a, b in _byte_batches(texts, batch_bytes)]
    return np.concatenate(batches) if batches else np.zeros(0, "S16")
