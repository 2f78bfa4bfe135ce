"""The incremental dedup index in the dataset repository: ``index/minhash/``, a partitioned store.

Layout (format 2)::

    index/minhash/<signature key>/params.json                          what the signatures depend on
    index/minhash/<signature key>/<run>/run.json                       banding, buckets, input commit
    index/minhash/<signature key>/<run>/documents/bucket-BBBBB.parquet  id, source, content_key, quality
    index/minhash/<signature key>/<run>/contents/bucket-BBBBB.parquet   content_key, signature, band_keys

Each dedup run adds, in its own ``<run>`` folder, the documents it saw that the index did not
hold yet (new ids, or ids whose text changed), bucketed by a hash of their id, and the
contents (whitespace-normalised texts) whose signature the index did not hold yet, bucketed by
their content key. A bucket of the shuffle (:mod:`tasks.dedup.shuffle`) reads the same bucket
of every published run, never the whole index. The folder name ``vNNNNN-<input commit>``
numbers runs in the order they were published; when an id appears in several runs the latest
entry wins. Runs are append-only and named per input commit, so two curate branches never
write the same path and their merges into ``main`` do not conflict.

A run written with another bucket count, or by the format-1 stage (``part-NNNNN.parquet`` with
every column), is still read: each bucket then filters all of that run's rows by its hash.

"Published" means present at the stage's input commit, which descends from ``main``: a run
reads the index there and never sees entries of an unpublished (failed) curate run. A
signature key names the signature parameters (:meth:`DedupConfig.signature_parameters`);
a config with other parameters reads and writes another folder, since its signatures would
not compare.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from formats import layout
from tasks.dedup.config import DedupConfig
from tasks.dedup.plan import PublishedIndex, keys_from_arrow
from tasks.parts import list_parts, put_json, read_part
from versioning import DataRepo

INDEX_FORMAT = 2
DOCUMENT_COLUMNS = ["id", "source", "content_key", "quality"]
CONTENT_COLUMNS = ["content_key", "signature", "band_keys"]


def index_folder(config: DedupConfig) -> str:
    return f"{layout.MINHASH_INDEX}/{config.signature_key()}"


def run_folders(repo: DataRepo, ref: str, config: DedupConfig) -> list[str]:
    """The run folders of this config's index at ``ref``, oldest first."""
    base = index_folder(config) + "/"
    names = {o.path[len(base) :].split("/", 1)[0] for o in repo.list(ref, base) if "/" in o.path[len(base) :]}
    return sorted(f"{base}{name}" for name in names)


def next_run_folder(repo: DataRepo, input_commit: str, config: DedupConfig) -> str:
    """Where this run writes: numbered after the runs published at its input commit."""
    return f"{index_folder(config)}/v{len(run_folders(repo, input_commit, config)):05d}-{input_commit[:16]}"


def bucket_file(folder: str, view: str, bucket: int) -> str:
    return f"{folder}/{view}/bucket-{bucket:05d}.parquet"


@dataclass(frozen=True)
class PublishedRun:
    """One published run folder, as a bucket task reads it."""

    folder: str
    order: int  # 0 = oldest; the latest entry of an id wins
    format: int
    buckets: int  # 0 for format 1 (not bucketed)
    banding: tuple[int, int]


def published_runs(repo: DataRepo, ref: str, config: DedupConfig) -> list[PublishedRun]:
    runs = []
    for order, folder in enumerate(run_folders(repo, ref, config)):
        meta = json.loads(repo.get(ref, f"{folder}/run.json"))
        fmt = int(meta.get("format", 1))
        runs.append(
            PublishedRun(
                folder, order, fmt, int(meta.get("buckets", 0)), (int(meta["bands"]), int(meta["rows"]))
            )
        )
    return runs


def id_buckets(ids: pa.Array | pa.ChunkedArray, buckets: int) -> np.ndarray:
    """The bucket of each document id (any string): 8 bytes of its BLAKE2b, modulo ``buckets``."""
    values = ids.to_pylist()
    digests = b"".join(hashlib.blake2b(str(v).encode(), digest_size=8).digest() for v in values)
    return (np.frombuffer(digests, "<u8") % np.uint64(buckets)).astype(np.int64)


def content_buckets(keys: np.ndarray, buckets: int) -> np.ndarray:
    """The bucket of each 16-byte content key (a sha256 prefix: its first 8 bytes are uniform)."""
    if len(keys) == 0:
        return np.zeros(0, np.int64)
    first = np.frombuffer(np.ascontiguousarray(keys, "S16").tobytes(), "<u8")[0::2]
    return (first % np.uint64(buckets)).astype(np.int64)


def _view(
    repo: DataRepo, ref: str, run: PublishedRun, view: str, bucket: int, buckets: int
) -> pa.Table | None:
    """One view of one published run, restricted to ``bucket`` of ``buckets``."""
    columns = DOCUMENT_COLUMNS if view == "documents" else CONTENT_COLUMNS
    if run.format >= 2 and run.buckets == buckets:
        paths = [
            p
            for p in list_parts(repo, ref, f"{run.folder}/{view}")
            if p == bucket_file(run.folder, view, bucket)
        ]
    else:  # another bucket count, or format 1: every file of the run, filtered by hash
        paths = list_parts(repo, ref, f"{run.folder}/{view}" if run.format >= 2 else run.folder)
    tables = [read_part(repo, ref, path, columns) for path in paths]
    if not tables:
        return None
    table = pa.concat_tables(tables)
    if run.format >= 2 and run.buckets == buckets:
        return table
    if view == "documents":
        mine = id_buckets(table.column("id"), buckets) == bucket
    else:
        mine = content_buckets(keys_from_arrow(table.column("content_key")), buckets) == bucket
    return table.filter(pa.array(mine))


def published_documents(
    repo: DataRepo, ref: str, runs: list[PublishedRun], bucket: int, buckets: int
) -> pa.Table:
    """The latest published entry of every id in ``bucket``: id, source, content_key, quality."""
    tables = []
    for run in runs:
        table = _view(repo, ref, run, "documents", bucket, buckets)
        if table is not None:
            tables.append(
                table.append_column("_order", pa.array(np.full(table.num_rows, run.order, np.int64)))
            )
    if not tables:
        return pa.table(
            {
                "id": pa.array([], pa.string()),
                "source": pa.array([], pa.string()),
                "content_key": pa.array([], pa.binary(16)),
                "quality": pa.array([], pa.float64()),
            }
        )
    table = pa.concat_tables(tables)
    table = table.append_column("_row", pa.array(np.arange(table.num_rows)))
    latest = table.group_by("id", use_threads=False).aggregate([("_row", "max")])
    return table.take(np.sort(latest.column("_row_max").to_numpy())).select(DOCUMENT_COLUMNS)


def published_contents(
    repo: DataRepo, ref: str, runs: list[PublishedRun], bucket: int, buckets: int, banding: tuple[int, int]
) -> tuple[pa.Table, np.ndarray]:
    """``(content_key, signature, band_keys)`` of every published content in ``bucket`` (band keys
    null where they were made with another banding), and which rows have usable band keys."""
    tables, usable = [], []
    for run in runs:
        table = _view(repo, ref, run, "contents", bucket, buckets)
        if table is not None:
            tables.append(table.select(["content_key", "signature"]))
            usable.append(
                table.column("band_keys")
                if run.banding == banding
                else pa.nulls(table.num_rows, pa.list_(pa.uint64(), banding[0]))
            )
    if not tables:
        return pa.table({"content_key": pa.array([], pa.binary(16))}), np.zeros(0, bool)
    table = pa.concat_tables(tables)
    keys = pa.chunked_array(
        [
            chunk
            for column in usable
            for chunk in (column.chunks if isinstance(column, pa.ChunkedArray) else [column])
        ]
    )
    table = table.append_column("band_keys", keys)
    return table, ~pc.is_null(table.column("band_keys")).to_numpy(zero_copy_only=False)


def write_run_meta(
    repo: DataRepo, branch: str, folder: str, config: DedupConfig, input_commit: str, documents: int
) -> None:
    bands, rows = config.banding
    put_json(repo, branch, f"{index_folder(config)}/params.json", config.signature_parameters())
    put_json(
        repo,
        branch,
        f"{folder}/run.json",
        {
            "format": INDEX_FORMAT,
            "bands": bands,
            "rows": rows,
            "buckets": config.buckets,
            "input_commit": input_commit,
            "documents": documents,
        },
    )


def load_published(repo: DataRepo, ref: str, config: DedupConfig) -> PublishedIndex:
    """Every published document's index entry at ``ref`` (latest per id), in memory: what the
    in-memory plan (:func:`tasks.dedup.plan.plan_dedup`) compares against."""
    runs = published_runs(repo, ref, config)
    if not runs:
        return PublishedIndex.empty(config.num_perm)
    docs = published_documents(repo, ref, runs, 0, 1)
    if docs.num_rows == 0:
        return PublishedIndex.empty(config.num_perm)
    bandings = {run.banding for run in runs}
    banding = next(iter(bandings)) if len(bandings) == 1 else None
    contents, _ = published_contents(repo, ref, runs, 0, 1, banding or (0, 0))
    content_keys = keys_from_arrow(contents.column("content_key"))
    at = pc.index_in(docs.column("content_key"), value_set=contents.column("content_key")).to_numpy(
        zero_copy_only=False
    )
    signature = (
        contents.column("signature").combine_chunks().flatten().to_numpy().reshape(len(content_keys), -1)
    )
    band_keys = None
    if banding is not None:
        band_keys = (
            contents.column("band_keys")
            .combine_chunks()
            .flatten()
            .to_numpy()
            .reshape(len(content_keys), -1)[at]
        )
    return PublishedIndex(
        ids=docs.column("id").to_numpy(zero_copy_only=False).astype(object),
        sources=docs.column("source").to_numpy(zero_copy_only=False).astype(object),
        content_keys=keys_from_arrow(docs.column("content_key")),
        quality=docs.column("quality").to_numpy(zero_copy_only=False).astype(np.float64),
        signatures=signature[at].astype(np.uint32),
        band_keys=band_keys,
        banding=banding,
    )
