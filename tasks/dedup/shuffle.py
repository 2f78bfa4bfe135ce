"""Dedup at scale: the plan of :func:`tasks.dedup.plan.plan_dedup` as a shuffle over buckets.

No process holds the corpus: each step is one partition map (:mod:`tasks.partition_map`)
over input parts or over ``B`` hash buckets (``DedupConfig.buckets``), and steps hand data to
each other as Parquet files that the workers write under a scratch folder of the run branch
(``_scratch/dedup/``, removed before the stage commits). Only small counts come back.

1. ``keys`` (per input part): content keys; the rows go to their **id** bucket, the contents
   to their **content** bucket.
2. ``needs`` (per content bucket): the contents no published run holds a signature for, each
   assigned to the first part that has it.
3. ``signatures`` (per input part): shingles and MinHash of the contents assigned to the part
   (each new text hashed once in the whole run), to their content bucket.
4. ``resolve`` (per id bucket): input rows against the published documents of the bucket
   (latest entry per id): which rows are already published, which published documents are not
   in the input; every document considered goes to its content bucket; new documents are
   written to the index (``documents/``).
5. ``contents`` (per content bucket): each live content's signature (new or published), its
   band keys (stored ones reused when the banding is the same), band records to their
   **band-key** bucket; new contents written to the index (``contents/``).
6. ``pairs`` (per band-key bucket): the rows of one LSH bucket sorted by content key, each
   paired with the next ``bucket_window`` (the rule of :func:`tasks.dedup.minhash.bucket_pairs`),
   pairs to the content bucket of their first content.
7. ``attach`` then ``verify`` (per content bucket): each pair gets the signature of its first
   content, then of its second, and is kept when the estimated similarity reaches the threshold.
8. ``components`` (one task): union-find over the verified edges only.
9. ``partials`` (per content bucket), ``representatives`` (one task), ``decide`` (per content
   bucket): the survivor of every cluster by the rule of :mod:`tasks.dedup.plan` (published
   first, then quality, then the smallest id), each input row's decision to its input part.
10. ``apply`` (per input part): the part's rows and decisions into ``dedup/`` and
    ``quarantine/dedup/`` (same part name).

Equal band keys, contents, documents and ids always meet in one bucket, and every order that
decides a result (content keys inside an LSH bucket, the preference of a cluster) is a sort
on values, so the decisions equal the in-memory plan's whatever the bucket count, the
partitioning or the runner (``tests/tasks/test_dedup_shuffle.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from formats import layout
from tasks.dedup.config import DedupConfig
from tasks.dedup.index import (
    PublishedRun,
    bucket_file,
    content_buckets,
    id_buckets,
    published_contents,
    published_documents,
)
from tasks.dedup.minhash import EMPTY_SLOT, band_keys, connected_components, signatures
from tasks.dedup.plan import (
    EXACT,
    NEAR,
    REQUIRED_COLUMNS,
    STAGE,
    DedupPlan,
    _best_of_group,
    _byte_batches,
    _quality,
    apply_plan,
    keys_from_arrow,
    keys_to_arrow,
)
from tasks.dedup.shingles import content_keys, shingle_hashes
from tasks.partition_map import partitions
from tasks.parts import list_parts, put_table, read_part
from tasks.stage import PartitionOutput, write_partition
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


def _signature_array(signature: np.ndarray) -> pa.Array:
    return pa.FixedSizeListArray.from_arrays(pa.array(signature.reshape(-1), pa.uint32()), signature.shape[1])


def _matrix(column: pa.ChunkedArray | pa.Array, width: int) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), width)


def _read_input(part: Part) -> pa.Table:
    table = read_part(part.run.repo, part.run.input_commit, part.path)
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(
            f"an input part lacks column(s) {', '.join(missing)}; dedup reads the filtered stage"
        )
    return table


def _keys(texts: pa.Array, batch_bytes: int) -> np.ndarray:
    batches = [content_keys(texts.slice(a, b - a)) for a, b in _byte_batches(texts, batch_bytes)]
    return np.concatenate(batches) if batches else np.zeros(0, "S16")


# ---- 1-3: keys, needs, signatures ----------------------------------------------------------


def keys_step(part: Part) -> dict[str, int]:
    run = part.run
    table = _read_input(part)
    keys = _keys(table.column("text").combine_chunks(), run.config.batch_bytes)
    quality = _quality(table, run.config.quality_column)
    rows = pa.table(
        [
            table.column("id").cast(pa.string()),
            table.column("source").cast(pa.string()),
            keys_to_arrow(keys),
            pa.array(np.where(np.isfinite(quality), quality, -np.inf)),
            pa.array(np.full(table.num_rows, part.index, np.int32)),
            pa.array(np.arange(table.num_rows, dtype=np.int32)),
        ],
        schema=ROWS,
    )
    run.scatter("rows", rows, id_buckets(rows.column("id"), run.buckets), part.producer)
    distinct = np.unique(keys)
    needs = pa.table(
        [keys_to_arrow(distinct), pa.array(np.full(len(distinct), part.index, np.int32))], schema=NEEDS
    )
    run.scatter("needs", needs, content_buckets(distinct, run.buckets), part.producer)
    return {"documents": table.num_rows}


def needs_step(bucket: Bucket) -> dict[str, int]:
    """Contents of this bucket without a published signature, each assigned to its first part."""
    run = bucket.run
    needs = run.read(run.at("needs", bucket.bucket), NEEDS)
    published, _ = published_contents(
        run.repo, run.input_commit, list(run.published), bucket.bucket, run.buckets, run.config.banding
    )
    new = needs.filter(
        pc.invert(pc.is_in(needs.column("content_key"), value_set=published.column("content_key")))
    )
    grouped = new.group_by("content_key", use_threads=False).aggregate([("part", "min")])
    first = pa.table(
        {"content_key": grouped.column("content_key"), "part": grouped.column("part_min")}, schema=NEEDS
    )
    run.scatter("assigned", first, first.column("part").to_numpy().astype(np.int64), bucket.producer)
    return {"contents_hashed": first.num_rows}


def signatures_step(part: Part) -> dict[str, int]:
    """Shingles and signatures of the contents assigned to this part (first occurrence of each)."""
    run, config = part.run, part.run.config
    assigned = run.read(run.at("assigned", part.index), NEEDS)
    if assigned.num_rows == 0:
        return {"shingled_bytes": 0}
    table = _read_input(part)
    texts = table.column("text").combine_chunks()
    keys = _keys(texts, config.batch_bytes)
    wanted = keys_from_arrow(assigned.column("content_key"))
    unique_keys, first_row = np.unique(keys, return_index=True)
    rows = np.sort(first_row[np.isin(unique_keys, wanted)])
    batch = texts.take(pa.array(rows))
    signature = np.zeros((0, config.num_perm), np.uint32)
    chunks = []
    for a, b in _byte_batches(batch, config.batch_bytes):
        hashes, offsets = shingle_hashes(batch.slice(a, b - a), config.ngram)
        chunks.append(signatures(hashes, offsets, config.num_perm, config.seed))
    if chunks:
        signature = np.concatenate(chunks)
    sigs = pa.table(
        [keys_to_arrow(keys[rows]), _signature_array(signature)], schema=signature_schema(config.num_perm)
    )
    run.scatter("signatures", sigs, content_buckets(keys[rows], run.buckets), part.producer)
    return {"shingled_bytes": int(pc.sum(pc.binary_length(batch)).as_py() or 0)}


# ---- 4-5: resolve (id buckets), contents (content buckets) ---------------------------------


def resolve_step(bucket: Bucket) -> dict[str, int]:
    run = bucket.run
    rows = run.read(run.at("rows", bucket.bucket), ROWS)
    latest = published_documents(run.repo, run.input_commit, list(run.published), bucket.bucket, run.buckets)
    matched = pc.fill_null(pc.index_in(rows.column("id"), value_set=latest.column("id")), -1).to_numpy(
        zero_copy_only=False
    )
    published = np.zeros(rows.num_rows, bool)
    hit = np.flatnonzero(matched >= 0)
    if len(hit):
        published[hit] = (
            keys_from_arrow(latest.column("content_key"))[matched[hit]]
            == keys_from_arrow(rows.column("content_key"))[hit]
        )
    only = latest.filter(pc.invert(pc.is_in(latest.column("id"), value_set=rows.column("id"))))
    quality = only.column("quality").to_numpy(zero_copy_only=False).astype(np.float64)
    only_docs = pa.table(
        [
            only.column("id"),
            only.column("source"),
            only.column("content_key"),
            pa.array(np.where(np.isfinite(quality), quality, -np.inf)),
            pa.array(np.full(only.num_rows, -1, np.int32)),
            pa.array(np.full(only.num_rows, -1, np.int32)),
            pa.array(np.ones(only.num_rows, bool)),
        ],
        schema=DOCS,
    )
    docs = pa.concat_tables([rows.append_column("published", pa.array(published)), only_docs])
    run.scatter(
        "docs",
        docs,
        content_buckets(keys_from_arrow(docs.column("content_key")), run.buckets),
        bucket.producer,
    )
    fresh = rows.filter(pa.array(~published)).sort_by([("part", "ascending"), ("row", "ascending")])
    if fresh.num_rows:
        put_table(
            run.repo,
            run.branch,
            bucket_file(run.index_run, "documents", bucket.bucket),
            fresh.select(["id", "source", "content_key", "quality"]),
        )
    return {
        "published_documents": latest.num_rows,
        "published_in_input": int(published.sum()),
        "index_entries_written": fresh.num_rows,
    }


def contents_step(bucket: Bucket) -> dict[str, int]:
    run, config = bucket.run, bucket.run.config
    bands, rows_per_band = config.banding
    docs = run.read(run.at("docs", bucket.bucket), DOCS)
    live = np.unique(keys_from_arrow(docs.column("content_key")))
    new = run.read(run.at("signatures", bucket.bucket), signature_schema(config.num_perm))
    published, usable = published_contents(
        run.repo, run.input_commit, list(run.published), bucket.bucket, run.buckets, config.banding
    )
    signature = np.zeros((len(live), config.num_perm), np.uint32)
    keys = np.zeros((len(live), bands), np.uint64)
    found = np.zeros(len(live), bool)
    stored = np.zeros(len(live), bool)
    if published.num_rows:
        at = np.searchsorted(live, keys_from_arrow(published.column("content_key")))
        hit = (at < len(live)) & (
            live[np.minimum(at, len(live) - 1)] == keys_from_arrow(published.column("content_key"))
        )
        signature[at[hit]] = _matrix(published.column("signature"), config.num_perm)[hit]
        found[at[hit]] = True
        with_keys = hit & usable
        if with_keys.any():
            keys[at[with_keys]] = _matrix(published.column("band_keys").filter(pa.array(with_keys)), bands)
            stored[at[with_keys]] = True
    if new.num_rows:
        at = np.searchsorted(live, keys_from_arrow(new.column("content_key")))
        signature[at] = _matrix(new.column("signature"), config.num_perm)
        fresh = np.zeros(len(live), bool)
        fresh[at] = ~found[at]
        found[at] = True
    else:
        fresh = np.zeros(len(live), bool)
    if not found.all():
        raise AssertionError(
            f"dedup bucket {bucket.bucket}: {int((~found).sum())} contents have no signature"
        )
    keys[~stored] = band_keys(signature[~stored], bands, rows_per_band)
    if fresh.any():
        put_table(
            run.repo,
            run.branch,
            bucket_file(run.index_run, "contents", bucket.bucket),
            pa.table(
                {
                    "content_key": keys_to_arrow(live[fresh]),
                    "signature": _signature_array(signature[fresh]),
                    "band_keys": pa.FixedSizeListArray.from_arrays(
                        pa.array(keys[fresh].reshape(-1), pa.uint64()), bands
                    ),
                }
            ),
        )
    eligible = ~np.all(signature == EMPTY_SLOT, axis=1)  # no shingles: exact matches only
    run.put(
        run.at("live", bucket.bucket, "signatures"),
        pa.table(
            [keys_to_arrow(live[eligible]), _signature_array(signature[eligible])],
            schema=signature_schema(config.num_perm),
        ),
    )
    n = int(eligible.sum())
    records = pa.table(
        [
            pa.array(np.repeat(np.arange(bands, dtype=np.int32)[None, :], n, axis=0).reshape(-1)),
            pa.array(keys[eligible].reshape(-1)),
            keys_to_arrow(np.repeat(live[eligible], bands)),
        ],
        schema=band_schema(),
    )
    run.scatter(
        "bands",
        records,
        (records.column("key").to_numpy() % np.uint64(run.buckets)).astype(np.int64),
        bucket.producer,
    )
    return {"contents": len(live), "band_keys_reused": int(stored.sum())}


# ---- 6-8: pairs, attach, verify, components ------------------------------------------------


def pairs_step(bucket: Bucket) -> dict[str, int]:
    """Candidate pairs of one band-key bucket, by the window rule over content-key order."""
    run = bucket.run
    records = run.read(run.at("bands", bucket.bucket), band_schema())
    content = keys_from_arrow(records.column("content_key"))
    band = records.column("band").to_numpy()
    key = records.column("key").to_numpy()
    order = np.lexsort((content, key, band))
    band, key, content = band[order], key[order], content[order]
    left, right = [], []
    for distance in range(1, run.config.bucket_window + 1):
        same = (band[distance:] == band[:-distance]) & (key[distance:] == key[:-distance])
        if not same.any():
            break
        left.append(content[:-distance][same])
        right.append(content[distance:][same])
    if not left:
        return {}
    a, b = _split(np.unique(np.concatenate([_pair_codes(x, y) for x, y in zip(left, right, strict=True)])))
    run.scatter(
        "pairs",
        pa.table([keys_to_arrow(a), keys_to_arrow(b)], schema=PAIRS),
        content_buckets(a, run.buckets),
        bucket.producer,
    )
    return {}


def _split(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """32-byte pair codes back into their two 16-byte content keys."""
    raw = np.frombuffer(codes.tobytes(), np.uint8).reshape(len(codes), 32)
    return (
        np.ascontiguousarray(raw[:, :16]).view("S16").reshape(-1),
        np.ascontiguousarray(raw[:, 16:]).view("S16").reshape(-1),
    )


def _pair_codes(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each pair of 16-byte keys as one 32-byte code (for np.unique)."""
    raw = np.empty((len(a), 32), np.uint8)
    raw[:, :16] = np.frombuffer(np.ascontiguousarray(a, "S16").tobytes(), np.uint8).reshape(-1, 16)
    raw[:, 16:] = np.frombuffer(np.ascontiguousarray(b, "S16").tobytes(), np.uint8).reshape(-1, 16)
    return raw.view("V32").reshape(-1)


def _live_signatures(run: ShuffleRun, bucket: int) -> tuple[np.ndarray, np.ndarray]:
    live = run.read(run.at("live", bucket), signature_schema(run.config.num_perm))
    return keys_from_arrow(live.column("content_key")), _matrix(live.column("signature"), run.config.num_perm)


def attach_step(bucket: Bucket) -> dict[str, int]:
    """Unique candidate pairs whose first content is in this bucket, with its signature."""
    run = bucket.run
    pairs = run.read(run.at("pairs", bucket.bucket), PAIRS)
    if pairs.num_rows == 0:
        return {"candidate_pairs": 0}
    a, b = _split(
        np.unique(_pair_codes(keys_from_arrow(pairs.column("a")), keys_from_arrow(pairs.column("b"))))
    )
    live, signature = _live_signatures(run, bucket.bucket)
    half = pa.table(
        [keys_to_arrow(a), keys_to_arrow(b), _signature_array(signature[np.searchsorted(live, a)])],
        names=["a", "b", "signature_a"],
    )
    run.scatter("halves", half, content_buckets(b, run.buckets), bucket.producer)
    return {"candidate_pairs": len(a)}


def verify_step(bucket: Bucket) -> dict[str, int]:
    run, config = bucket.run, bucket.run.config
    schema = pa.schema([("a", KEY), ("b", KEY), ("signature_a", pa.list_(pa.uint32(), config.num_perm))])
    halves = run.read(run.at("halves", bucket.bucket), schema)
    if halves.num_rows == 0:
        return {"verified_pairs": 0}
    live, signature = _live_signatures(run, bucket.bucket)
    first = _matrix(halves.column("signature_a"), config.num_perm)
    second_rows = np.searchsorted(live, keys_from_arrow(halves.column("b")))
    similarity = np.empty(halves.num_rows, np.float64)
    for start in range(0, halves.num_rows, 8192):  # as tasks.dedup.minhash.estimated_similarity
        stop = start + 8192
        similarity[start:stop] = (first[start:stop] == signature[second_rows[start:stop]]).mean(axis=1)
    verified = similarity >= config.threshold
    run.put(run.at("edges", bucket.bucket, "edges"), halves.select(["a", "b"]).filter(pa.array(verified)))
    return {"verified_pairs": int(verified.sum())}


def components_step(run: ShuffleRun) -> dict[str, int]:
    """Union-find over the verified edges (the only step that sees them all; they are few)."""
    edges = run.read(f"{run.scratch}/edges", EDGES)
    a, b = keys_from_arrow(edges.column("a")), keys_from_arrow(edges.column("b"))
    nodes = np.unique(np.concatenate([a, b]))
    parent = connected_components(len(nodes), np.searchsorted(nodes, a), np.searchsorted(nodes, b))
    labels = pa.table([keys_to_arrow(nodes), keys_to_arrow(nodes[parent])], schema=LABELS)
    run.scatter("labels", labels, content_buckets(nodes, run.buckets), "labels")
    return {"linked_contents": len(nodes)}


# ---- 9: survivors -------------------------------------------------------------------------


def _preference(ids: pa.Array | pa.ChunkedArray, quality: np.ndarray, published: np.ndarray) -> tuple:
    """``np.lexsort`` keys of the survivor rule: published first, then quality, then the smallest id."""
    rank = pc.rank(ids, sort_keys="ascending", tiebreaker="first").to_numpy()
    return rank, -quality, ~published


def _labelled(run: ShuffleRun, bucket: int) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """The documents of a content bucket, their content keys and their cluster labels (a content
    linked to no other is its own label)."""
    docs = run.read(run.at("docs", bucket), DOCS)
    keys = keys_from_arrow(docs.column("content_key"))
    labels = run.read(run.at("labels", bucket), LABELS)
    label = keys.copy()
    if labels.num_rows:
        linked = keys_from_arrow(labels.column("content_key"))
        at = np.minimum(np.searchsorted(linked, keys), len(linked) - 1)
        hit = linked[at] == keys
        label[hit] = keys_from_arrow(labels.column("label"))[at[hit]]
    return docs, keys, label


def partials_step(bucket: Bucket) -> dict[str, int]:
    """For each cluster spanning several contents: this bucket's best document and count."""
    run = bucket.run
    docs, keys, label = _labelled(run, bucket.bucket)
    labels = run.read(run.at("labels", bucket.bucket), LABELS)
    linked = np.isin(keys, keys_from_arrow(labels.column("content_key")))
    docs, label = docs.filter(pa.array(linked)), label[linked]
    if docs.num_rows == 0:
        return {}
    group = np.unique(label, return_inverse=True)[1]
    quality = docs.column("quality").to_numpy()
    published = docs.column("published").to_numpy(zero_copy_only=False)
    best = np.unique(_best_of_group(group, _preference(docs.column("id"), quality, published)))
    counts = np.bincount(group)
    run.put(
        run.at("partials", 0, bucket.producer),
        pa.table(
            [
                keys_to_arrow(label[best]),
                docs.column("id").take(pa.array(best)),
                pa.array(published[best]),
                pa.array(quality[best]),
                pa.array(counts[group[best]].astype(np.int64)),
            ],
            schema=PARTIALS,
        ),
    )
    return {}


def representatives_step(run: ShuffleRun) -> dict[str, int]:
    """The survivor and size of every cluster spanning several contents, for each of its contents."""
    partials = run.read(run.at("partials", 0), PARTIALS)
    labels = run.read(f"{run.scratch}/labels", LABELS)
    if partials.num_rows == 0:
        return {"linked_clusters": 0}
    label = keys_from_arrow(partials.column("label"))
    names, group = np.unique(label, return_inverse=True)
    quality = partials.column("quality").to_numpy()
    published = partials.column("published").to_numpy(zero_copy_only=False)
    best = _best_of_group(group, _preference(partials.column("id"), quality, published))
    size = np.bincount(group, weights=partials.column("count").to_numpy()).astype(np.int64)
    first = np.unique(best)
    rep_of_name = dict(
        zip(label[first].tolist(), partials.column("id").take(pa.array(first)).to_pylist(), strict=True)
    )
    size_of_name = dict(zip(names.tolist(), size.tolist(), strict=True))
    content_label = keys_from_arrow(labels.column("label")).tolist()
    representatives = pa.table(
        [
            labels.column("content_key"),
            pa.array([rep_of_name[x] for x in content_label], pa.string()),
            pa.array([size_of_name[x] for x in content_label], pa.int64()),
        ],
        schema=REPRESENTATIVES,
    )
    run.scatter(
        "representatives",
        representatives,
        content_buckets(keys_from_arrow(labels.column("content_key")), run.buckets),
        "all",
    )
    return {"linked_clusters": len(names)}


def decide_step(bucket: Bucket) -> dict[str, int]:
    """Every input row of this content bucket: kept or removed, why, and its cluster."""
    run, config = bucket.run, bucket.run.config
    docs, keys, _ = _labelled(run, bucket.bucket)
    if docs.num_rows == 0:
        return {"clusters_with_duplicates": 0}
    reps = run.read(run.at("representatives", bucket.bucket), REPRESENTATIVES)
    contents, content_of = np.unique(keys, return_inverse=True)
    ids = docs.column("id")
    id_values = ids.to_numpy(zero_copy_only=False).astype(object)
    quality = docs.column("quality").to_numpy()
    published = docs.column("published").to_numpy(zero_copy_only=False)
    best_with_text = _best_of_group(content_of, _preference(ids, quality, published))
    representative = id_values[best_with_text].copy()
    size = np.bincount(content_of)[content_of]
    linked = np.zeros(len(contents), bool)
    if reps.num_rows:
        at = np.searchsorted(contents, keys_from_arrow(reps.column("content_key")))
        hit = (at < len(contents)) & (
            contents[np.minimum(at, len(contents) - 1)] == keys_from_arrow(reps.column("content_key"))
        )
        rep_name = np.empty(len(contents), object)
        rep_size = np.zeros(len(contents), np.int64)
        rep_name[at[hit]] = np.array(reps.column("representative").to_pylist(), object)[hit]
        rep_size[at[hit]] = reps.column("size").to_numpy()[hit]
        linked[at[hit]] = True
        in_cluster = linked[content_of]
        representative[in_cluster] = rep_name[content_of][in_cluster]
        size[in_cluster] = rep_size[content_of][in_cluster]
    # a cluster of one content is counted here; one of several contents by representatives_step
    duplicates_here = int(np.count_nonzero((np.bincount(content_of) > 1) & ~linked))

    inputs = np.flatnonzero(docs.column("part").to_numpy() >= 0)
    survivor = (representative[inputs] == id_values[inputs]) | (config.mode == "soft")
    exact = best_with_text[inputs] != inputs
    reason = np.where(survivor, None, np.where(exact, EXACT, NEAR)).astype(object)
    duplicate_of = np.where(exact, id_values[best_with_text[inputs]], representative[inputs])
    cluster_size = size[inputs].astype(np.int64)
    weight = cluster_size**-config.soft_weight_exponent if config.mode == "soft" else np.ones(len(inputs))
    decisions = pa.table(
        [
            docs.column("row").take(pa.array(inputs)),
            pa.array(representative[inputs], pa.string()),
            pa.array(cluster_size),
            pa.array(weight.astype(np.float64)),
            pa.array(~survivor),
            pa.array(reason, pa.string()),
            pa.array(np.where(survivor, None, duplicate_of).astype(object), pa.string()),
        ],
        schema=DECISIONS,
    )
    part = docs.column("part").to_numpy()[inputs].astype(np.int64)
    run.scatter("decisions", decisions, part, bucket.producer)
    return {"clusters_with_duplicates": duplicates_here}


def apply_step(part: Part) -> PartitionOutput:
    run = part.run
    table = read_part(run.repo, run.input_commit, part.path)
    decisions = run.read(run.at("decisions", part.index), DECISIONS).sort_by("row")
    if decisions.column("row").to_pylist() != list(range(table.num_rows)):
        raise AssertionError(f"dedup: the decisions for {part.path} do not cover each of its rows once")
    plan = DedupPlan(
        dup_cluster=decisions.column("dup_cluster").to_numpy(zero_copy_only=False).astype(object),
        cluster_size=decisions.column("cluster_size").to_numpy(),
        weight=decisions.column("weight").to_numpy(),
        removed=decisions.column("removed").to_numpy(zero_copy_only=False),
        reason=decisions.column("reason").to_numpy(zero_copy_only=False).astype(object),
        duplicate_of=decisions.column("duplicate_of").to_numpy(zero_copy_only=False).astype(object),
        index_entries=pa.table({}),
        clusters=pa.table({}),
        similar_pairs=pa.table({}),
    )
    kept, quarantined = apply_plan(table, plan, 0)
    output = write_partition(
        run.repo, run.branch, STAGE, layout.DEDUP, part.source, part.path.rsplit("/", 1)[1], kept, quarantined
    )
    output.facts = {"weight_total": float(np.sum(plan.weight[~plan.removed]))}
    return output


# ---- the whole plan ------------------------------------------------------------------------


@dataclass
class ShuffleStats:
    numbers: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def step(self, name: str, work: Callable[[Any], dict[str, int]], items: Iterable[Any]) -> None:
        started = time.perf_counter()
        for counts in partitions().map(f"dedup-{name}", work, list(items)):
            for key, value in counts.items():
                self.numbers[key] = self.numbers.get(key, 0) + value
        self.seconds[name] = round(time.perf_counter() - started, 3)


def plan_in_buckets(run: ShuffleRun, parts: list[Part]) -> ShuffleStats:
    """Steps 1-9: every input row's decision written to the scratch folder; returns the counts."""
    buckets = [Bucket(run, b) for b in range(run.buckets)]
    stats = ShuffleStats()
    stats.step("keys", keys_step, parts)
    stats.step("needs", needs_step, buckets)
    stats.step("signatures", signatures_step, parts)
    stats.step("resolve", resolve_step, buckets)
    stats.step("contents", contents_step, buckets)
    stats.step("pairs", pairs_step, buckets)
    stats.step("attach", attach_step, buckets)
    stats.step("verify", verify_step, buckets)
    stats.step("components", components_step, [run])
    stats.step("partials", partials_step, buckets)
    stats.step("representatives", representatives_step, [run])
    stats.step("decide", decide_step, buckets)
    stats.numbers["clusters_with_duplicates"] = stats.numbers.get(
        "clusters_with_duplicates", 0
    ) + stats.numbers.pop("linked_clusters", 0)
    return stats
