"""What the steps of the dedup shuffle share: the run, its items, the scratch files' schemas.

A step hands rows to the next through scratch objects of two kinds:

- a **file** ``<step>/b<receiver>/<name>.parquet``, for the steps that write one object per
  bucket they own (``run.put``);
- a **bundle** ``<step>/bundles/<producer>-<receivers>.bundle``, one per producing task and
  step (``run.scatter``): the Parquet file of each receiving bucket (or part) one after the
  other, then an index of ``receivers`` entries of (offset, length), 16 bytes each, at the
  end. A receiver reads its 16-byte entry, then its slice: two ranged reads, and the object
  count of a part-to-bucket step is the number of parts, not parts x buckets. One Parquet file
  with a row group per receiver would do the same, but its footer (the metadata of every row
  group) is read by every receiver: about 1 KB per receiver, so each of 4,096 receivers would
  read megabytes of footer to find its slice.

``run.read`` and ``run.in_slices`` read both kinds for a receiver, in producer order.
"""

from __future__ import annotations

import io
import math
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tasks.dedup.config import DedupConfig
from tasks.dedup.index import PublishedRun
from tasks.dedup.plan import REQUIRED_COLUMNS, _byte_batches, keys_from_arrow
from tasks.dedup.shingles import content_keys
from tasks.parts import put_table, read_part, read_part_in_row_groups
from versioning import DataRepo, validate_path
from versioning.scratch import owned_prefix, sweep

KEY = pa.binary(16)
INDEX_ENTRY = np.dtype([("offset", "<u8"), ("length", "<u8")])
_RECEIVER_FOLDER = re.compile(r"^(?P<step>.+)/b(?P<receiver>\d+)$")


@dataclass(frozen=True)
class Source:
    """Where a receiver's rows are: a whole scratch file, or a slice of a bundle."""

    path: str
    offset: int = 0
    length: int | None = None  # None: the whole object


def local_scratch(kind: str) -> tempfile.TemporaryDirectory[str]:
    """A local folder for spilled rows, named by its owner; what killed workers of this host left
    of the same kind is removed first (versioning/scratch.py)."""
    sweep(Path(tempfile.gettempdir()), kind)
    return tempfile.TemporaryDirectory(prefix=owned_prefix(kind))


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

    def bundle_path(self, step: str, producer: str, receivers: int) -> str:
        return validate_path(f"{self.scratch}/{step}/bundles/{producer}-{receivers}.bundle")

    def sources(self, folder: str) -> list[tuple[Source, int]]:
        """``(source, bytes)`` of everything written for the receiver of ``folder``
        (``run.at(step, receiver)``): its files, then its slices of the step's bundles."""
        found = [
            (Source(o.path), o.size)
            for o in sorted(self.repo.list(self.branch, folder.rstrip("/") + "/"), key=lambda o: o.path)
            if o.path.endswith(".parquet")
        ]
        match = _RECEIVER_FOLDER.match(folder.rstrip("/"))
        if match is None:
            return found
        receiver = int(match["receiver"])
        prefix = f"{match['step']}/bundles/"
        for info in sorted(self.repo.list(self.branch, prefix), key=lambda o: o.path):
            receivers = int(info.path.rsplit("-", 1)[1].removesuffix(".bundle"))
            if receiver >= receivers:
                continue
            data_end = info.size - receivers * INDEX_ENTRY.itemsize
            with self.repo.open(self.branch, info.path) as f:
                f.seek(data_end + receiver * INDEX_ENTRY.itemsize)
                entry = np.frombuffer(f.read(INDEX_ENTRY.itemsize), INDEX_ENTRY)[0]
            offset, length = int(entry["offset"]), int(entry["length"])
            if offset + length > data_end:
                raise ValueError(f"{info.path}: the index entry of receiver {receiver} points past the data")
            if length:
                found.append((Source(info.path, offset, length), length))
        return found

    def read(self, folder: str, schema: pa.Schema) -> pa.Table:
        """Everything written for the receiver of a scratch folder, in producer order (empty: ``schema``)."""
        return self._read_sources([source for source, _ in self.sources(folder)], schema)

    def _read_sources(self, sources: list[Source], schema: pa.Schema) -> pa.Table:
        tables = [pq.read_table(pa.BufferReader(self.source_bytes(s)), columns=schema.names) for s in sources]
        return pa.concat_tables(tables).cast(schema) if tables else schema.empty_table()

    def source_bytes(self, source: Source) -> bytes:
        with self.repo.open(self.branch, source.path) as f:
            if source.length is None:
                return f.read()
            f.seek(source.offset)
            return f.read(source.length)

    def _row_groups(self, source: Source, columns: list[str]) -> Iterator[pa.Table]:
        if source.length is None:
            yield from read_part_in_row_groups(self.repo, self.branch, source.path, columns)
            return
        parquet = pq.ParquetFile(pa.BufferReader(self.source_bytes(source)))
        for group in range(parquet.num_row_groups):
            yield parquet.read_row_group(group, columns=columns)

    def scatter(self, step: str, table: pa.Table, bucket: np.ndarray, producer: str) -> None:
        """Write the rows of ``table`` to the bucket each belongs to (one file per non-empty bucket)."""
        with BucketWriter(self, step, producer) as writer:
            writer.write(table, bucket)

    def in_slices(self, inputs: list[SlicedInput]) -> Iterator[tuple[int, int, list[pa.Table]]]:
        """``(s, slices, tables)``: the tables of ``inputs``, one slice at a time (every input's
        rows of slice ``s`` together).

        A bucket whose input files hold more than ``config.slice_bytes`` is cut into
        ``ceil(bytes / slice_bytes)`` slices by each row's :func:`slice_of` key, spilled to local
        Arrow IPC files in one pass over the files' row groups, then read back slice by slice: a
        bucket step holds one slice and one row group, not its bucket. Equal keys always share a slice, so
        a step that groups by its key gives the same results whatever the slice count.
        """
        listed = [self.sources(i.folder) for i in inputs]
        total = sum(size for files in listed for _, size in files)
        slices = max(1, math.ceil(total / self.config.slice_bytes))
        if slices == 1:
            yield (
                0,
                1,
                [
                    self._read_sources([source for source, _ in files], i.schema)
                    for i, files in zip(inputs, listed, strict=True)
                ],
            )
            return
        with local_scratch("dedup-slices") as spill:
            names: list[list[str | None]] = [[None] * slices for _ in inputs]
            for n, (sliced, files) in enumerate(zip(inputs, listed, strict=True)):
                writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
                try:
                    for source, _ in files:
                        for group in self._row_groups(source, sliced.schema.names):
                            table = group.cast(sliced.schema)
                            for s, rows in _split_by(table, sliced.slice_of(table, slices)):
                                if s not in writers:
                                    names[n][s] = os.path.join(spill, f"{n}-{s}.arrow")
                                    writers[s] = pa.ipc.new_stream(names[n][s], sliced.schema)
                                writers[s].write_table(rows)
                            del table, group
                finally:
                    for writer in writers.values():
                        writer.close()
            for s in range(slices):
                yield (
                    s,
                    slices,
                    [
                        _read_spill(name[s]).cast(i.schema) if name[s] else i.schema.empty_table()
                        for i, name in zip(inputs, names, strict=True)
                    ],
                )


@dataclass(frozen=True)
class SlicedInput:
    """One input of a bucket step read in slices: its scratch folder, schema and each row's slice."""

    folder: str
    schema: pa.Schema
    slice_of: Callable[[pa.Table, int], np.ndarray]


def slice_of_content(column: str) -> Callable[[pa.Table, int], np.ndarray]:
    """Slices by a 16-byte content key: its second 8 bytes (the first 8 chose the bucket)."""

    def slice_of(table: pa.Table, slices: int) -> np.ndarray:
        keys = np.frombuffer(
            np.ascontiguousarray(keys_from_arrow(table.column(column)), "S16").tobytes(), "<u8"
        )[1::2]
        return (keys % np.uint64(slices)).astype(np.int64)

    return slice_of


def slice_of_band_key(buckets: int) -> Callable[[pa.Table, int], np.ndarray]:
    """Slices by a uint64 band key: its quotient by ``buckets`` (the remainder chose the bucket)."""

    def slice_of(table: pa.Table, slices: int) -> np.ndarray:
        quotient = table.column("key").to_numpy() // np.uint64(buckets)
        return (quotient % np.uint64(slices)).astype(np.int64)

    return slice_of


def _read_spill(path: str) -> pa.Table:
    # read into memory, not memory-mapped: the table outlives the file (the spill folder is
    # removed), and a closed map under a zero-copy table crashed a worker with SIGSEGV
    with pa.OSFile(path, "rb") as source:
        return pa.ipc.open_stream(source).read_all().combine_chunks()


def _split_by(table: pa.Table, group: np.ndarray) -> Iterator[tuple[int, pa.Table]]:
    """``(g, rows of group g)`` for each non-empty group, in group order, rows in table order."""
    order = np.argsort(group, kind="stable")
    ordered, table = group[order], table.take(pa.array(order))
    bounds = np.flatnonzero(np.diff(ordered)) + 1
    for start, stop in zip(np.r_[0, bounds], np.r_[bounds, len(ordered)], strict=True):
        if stop > start:
            yield int(ordered[start]), table.slice(start, stop - start)


class StreamedFile:
    """One Parquet object written in several row groups through a local file, put when closed
    (nothing is put if nothing was written)."""

    def __init__(self, repo: DataRepo, branch: str, path: str):
        self.repo, self.branch, self.path = repo, branch, validate_path(path)
        self._local: str | None = None
        self._writer: pq.ParquetWriter | None = None

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if self._writer is None:
            handle, self._local = tempfile.mkstemp(prefix="tokenlake-dedup-", suffix=".parquet")
            os.close(handle)
            self._writer = pq.ParquetWriter(self._local, table.schema, compression="zstd")
        self._writer.write_table(table.combine_chunks())

    def __enter__(self) -> StreamedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(put=exc[0] is None)

    def close(self, put: bool = True) -> None:
        if self._writer is None or self._local is None:
            return
        try:
            self._writer.close()
            if put:
                self.repo.put(self.branch, self.path, self._local)
        finally:
            os.unlink(self._local)
            self._writer = self._local = None


class BucketWriter:
    """One step's output rows, written across several calls, to the receiver (bucket or part)
    each row belongs to, as one bundle put when the writer closes (see the module): a step
    that works in slices still writes one object, not one per receiver and slice. Rows wait in
    memory up to ``config.slice_bytes``, beyond that in local Arrow IPC files (an open Parquet
    writer per receiver would cost megabytes each).
    """

    def __init__(self, run: ShuffleRun, step: str, producer: str):
        self.run, self.step, self.producer = run, step, producer
        self._pending: dict[int, list[pa.Table]] = {}
        self._pending_bytes = 0
        self._spill: tempfile.TemporaryDirectory[str] | None = None
        self._spilled: dict[int, list[str]] = {}

    def write(self, table: pa.Table, bucket: np.ndarray) -> None:
        for b, rows in _split_by(table, bucket):
            self._pending.setdefault(b, []).append(rows)
            self._pending_bytes += rows.nbytes
        if self._pending_bytes > self.run.config.slice_bytes:
            self._spill_pending()

    def _spill_pending(self) -> None:
        if self._spill is None:
            self._spill = local_scratch("dedup-out")
        for b, tables in self._pending.items():
            name = os.path.join(self._spill.name, f"{b}-{len(self._spilled.get(b, []))}.arrow")
            with pa.ipc.new_stream(name, tables[0].schema) as writer:
                for table in tables:
                    writer.write_table(table)
            self._spilled.setdefault(b, []).append(name)
        self._pending, self._pending_bytes = {}, 0

    def __enter__(self) -> BucketWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                self._put_bundle()
        finally:
            self._pending, self._spilled = {}, {}
            if self._spill is not None:
                self._spill.cleanup()

    def _put_bundle(self) -> None:
        receivers = sorted(set(self._pending) | set(self._spilled))
        if not receivers:
            return
        index = np.zeros(receivers[-1] + 1, INDEX_ENTRY)
        handle, local = tempfile.mkstemp(prefix="tokenlake-dedup-bundle-")
        try:
            with os.fdopen(handle, "wb") as bundle:
                for b in receivers:
                    tables = [_read_spill(name) for name in self._spilled.get(b, [])] + self._pending.get(
                        b, []
                    )
                    buffer = io.BytesIO()
                    pq.write_table(pa.concat_tables(tables), buffer, compression="zstd")
                    index[b] = (bundle.tell(), buffer.tell())
                    bundle.write(buffer.getbuffer())
                    del tables, buffer
                bundle.write(index.tobytes())
            self.run.repo.put(
                self.run.branch, self.run.bundle_path(self.step, self.producer, len(index)), local
            )
        finally:
            os.unlink(local)


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
CONTENT_KEYS = pa.schema([("content_key", KEY)])
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
        ("bucket", pa.int32()),  # the content bucket that sent it (and gets the cluster's survivor)
    ]
)
REPRESENTATIVES = pa.schema([("label", KEY), ("representative", pa.string()), ("size", pa.int64())])
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


def halves_schema(num_perm: int) -> pa.Schema:
    return pa.schema([("a", KEY), ("b", KEY), ("signature_a", pa.list_(pa.uint32(), num_perm))])


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
