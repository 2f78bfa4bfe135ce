"""The dedup stage as pure functions over Arrow tables: plan (cluster everything), then apply.

:func:`plan_dedup` reads the input parts once: per part, content keys and, for every content
not seen before (in this run or in the published index), shingles and a MinHash signature.
It then clusters the contents (documents with one content are one node, so exact
duplicates need no comparison), picks one representative per cluster and returns a
:class:`DedupPlan` addressed by input row. :func:`apply_plan` then splits each part, read
again in the same order, into kept rows (with ``dup_cluster``, ``cluster_size``, ``weight``)
and quarantined rows (with ``reason``, ``duplicate_of`` and ``dup_cluster``). Nothing depends on the order
of the input except that row addressing: the same documents give the same clusters and the
same survivors.

Representative of a cluster: a document already published (in the index) first, so a new
version never evicts what earlier versions published; then the highest quality score; then
the smallest id. A removed document is an ``exact_duplicate`` when a document preferred to
it has the same whitespace-normalised text (``duplicate_of`` names the most preferred such
document), else a ``near_duplicate`` (``duplicate_of`` names its cluster's representative).
``dup_cluster`` always names the representative: the one document of the cluster kept.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.dedup.config import DedupConfig
from tasks.dedup.minhash import (
    EMPTY_SLOT,
    band_keys,
    candidate_pairs,
    connected_components,
    estimated_similarity,
    signatures,
)
from tasks.dedup.shingles import content_keys, shingle_hashes
from tasks.schema import with_quarantine_reason

STAGE = "dedup"
EXACT = "exact_duplicate"
NEAR = "near_duplicate"
REQUIRED_COLUMNS = ("id", "source", "text")
ADDED_COLUMNS = ("dup_cluster", "cluster_size", "weight")


@dataclass
class PublishedIndex:
    """Documents of earlier published versions: what incremental dedup compares against.

    ``band_keys`` are the stored LSH keys, made with ``banding``; they are used when the
    current banding is the same and recomputed from the signatures otherwise.
    """

    ids: np.ndarray  # object (str)
    sources: np.ndarray  # object (str)
    content_keys: np.ndarray  # S16
    quality: np.ndarray  # float64
    signatures: np.ndarray  # uint32 (n, num_perm)
    band_keys: np.ndarray | None = None  # uint64 (n, bands)
    banding: tuple[int, int] | None = None

    @classmethod
    def empty(cls, num_perm: int) -> PublishedIndex:
        return cls(
            ids=np.zeros(0, object),
            sources=np.zeros(0, object),
            content_keys=np.zeros(0, "S16"),
            quality=np.zeros(0, np.float64),
            signatures=np.zeros((0, num_perm), np.uint32),
        )

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class DedupPlan:
    """What to do with each input row (in input order), plus the index entries to publish."""

    dup_cluster: np.ndarray  # object: the representative's id
    cluster_size: np.ndarray  # int64: documents in the cluster, published ones included
    weight: np.ndarray  # float64
    removed: np.ndarray  # bool
    reason: np.ndarray  # object: None for kept rows
    duplicate_of: (
        np.ndarray
    )  # object: for removed rows the document they duplicate (see module doc), else None
    index_entries: pa.Table
    clusters: pa.Table  # every document considered: id, source, cluster, in_input
    similar_pairs: pa.Table  # verified near-duplicate pairs: id_a, id_b, similarity (one id per content)
    stats: dict[str, Any] = field(default_factory=dict)


def index_schema(num_perm: int, bands: int) -> pa.Schema:
    return pa.schema(
        [
            ("id", pa.string()),
            ("source", pa.string()),
            ("content_key", pa.binary(16)),
            ("quality", pa.float64()),
            ("signature", pa.list_(pa.uint32(), num_perm)),
            ("band_keys", pa.list_(pa.uint64(), bands)),
        ]
    )


def plan_dedup(
    parts: Iterable[pa.Table], config: DedupConfig, published: PublishedIndex | None = None
) -> DedupPlan:
    """Cluster the documents of ``parts`` (and of ``published``) and decide every input row."""
    published = published if published is not None else PublishedIndex.empty(config.num_perm)
    if published.signatures.shape[1] != config.num_perm:
        raise ValueError(
            f"the published index has {published.signatures.shape[1]}-value signatures "
            f"but the config asks for num_perm={config.num_perm}"
        )
    started = time.perf_counter()
    scan = _scan(parts, config, set(published.content_keys.tolist()))
    scanned = time.perf_counter()

    docs = _Documents.of(scan, published)
    n_in = len(scan.ids)
    contents, content_of = np.unique(docs.keys, return_inverse=True)
    signature = np.empty((len(contents), config.num_perm), np.uint32)
    _fill(signature, contents, published.content_keys, published.signatures)
    _fill(signature, contents, scan.new_keys, scan.new_signatures)

    bands, rows = config.banding
    keys = np.empty((len(contents), bands), np.uint64)
    stored = np.zeros(len(contents), bool)
    if published.band_keys is not None and published.banding == (bands, rows):
        stored = _fill(keys, contents, published.content_keys, published.band_keys)  # the stored LSH keys
    keys[~stored] = band_keys(signature[~stored], bands, rows)
    eligible = ~np.all(signature == EMPTY_SLOT, axis=1)  # no shingles: exact matches only
    a, b = candidate_pairs(keys, eligible, config.bucket_window)
    similarity = estimated_similarity(signature, a, b)
    verified = similarity >= config.threshold
    label = connected_components(len(contents), a[verified], b[verified])[content_of]
    clustered = time.perf_counter()

    id_rank = pc.rank(pa.array(docs.ids, pa.string()), sort_keys="ascending", tiebreaker="first").to_numpy()
    preference = (id_rank, -docs.quality, ~docs.published)
    representative = _best_of_group(label, preference)  # the cluster's survivor
    best_with_text = _best_of_group(content_of, preference)  # the first document of each text
    size = np.bincount(label, minlength=len(contents))[label]

    rep_in = representative[:n_in]
    survivor = (rep_in == np.arange(n_in)) | (config.mode == "soft")
    exact = best_with_text[:n_in] != np.arange(n_in)
    reason = np.where(survivor, None, np.where(exact, EXACT, NEAR)).astype(object)
    duplicate_of = np.where(exact, docs.ids[best_with_text[:n_in]], docs.ids[rep_in])
    weight = size[:n_in] ** -config.soft_weight_exponent if config.mode == "soft" else np.ones(n_in)
    fresh = ~docs.published[:n_in]
    index_entries = _index_table(
        scan,
        fresh,
        signature[content_of[:n_in][fresh]],
        keys[content_of[:n_in][fresh]],
        config.num_perm,
        bands,
    )
    clusters = pa.table(
        {
            "id": pa.array(docs.ids, pa.string()),
            "source": pa.array(docs.sources, pa.string()),
            "cluster": pa.array(docs.ids[representative], pa.string()),
            "in_input": pa.array(np.arange(len(docs.ids)) < n_in),
        }
    )
    first_doc = np.full(len(contents), len(docs.ids), np.int64)
    np.minimum.at(first_doc, content_of, np.arange(len(docs.ids)))
    similar_pairs = pa.table(
        {
            "id_a": pa.array(docs.ids[first_doc[a[verified]]], pa.string()),
            "id_b": pa.array(docs.ids[first_doc[b[verified]]], pa.string()),
            "similarity": pa.array(similarity[verified], pa.float64()),
        }
    )
    stats = {
        "documents": n_in,
        "published_documents": len(published),
        "published_in_input": int(docs.published[:n_in].sum()),
        "contents": int(len(contents)),
        "contents_hashed": len(scan.new_keys),
        "band_keys_reused": int(stored.sum()),
        "shingled_megabytes": round(scan.shingled_bytes / 1e6, 3),
        "bands": bands,
        "rows": rows,
        "candidate_pairs": int(len(a)),
        "verified_pairs": int(verified.sum()),
        "clusters_with_duplicates": int(np.count_nonzero(np.bincount(label) > 1)),
        "seconds_signatures": round(scanned - started, 3),
        "seconds_clustering": round(clustered - scanned, 3),
        "seconds_representatives": round(time.perf_counter() - clustered, 3),
    }
    return DedupPlan(
        dup_cluster=docs.ids[rep_in],
        cluster_size=size[:n_in].astype(np.int64),
        weight=weight.astype(np.float64),
        removed=~survivor,
        reason=reason,
        duplicate_of=np.where(survivor, None, duplicate_of).astype(object),
        index_entries=index_entries,
        clusters=clusters,
        similar_pairs=similar_pairs,
        stats=stats,
    )


def apply_plan(table: pa.Table, plan: DedupPlan, start: int) -> tuple[pa.Table, pa.Table]:
    """(kept rows with the added columns, quarantined rows with reason and duplicate_of) of the
    part whose first row is input row ``start`` of the plan."""
    rows = slice(start, start + table.num_rows)
    base = table.drop_columns(
        [c for c in (*ADDED_COLUMNS, "duplicate_of", "stage", "reason") if c in table.column_names]
    )
    annotated = (
        base.append_column("dup_cluster", pa.array(plan.dup_cluster[rows], pa.string()))
        .append_column("cluster_size", pa.array(plan.cluster_size[rows], pa.int64()))
        .append_column("weight", pa.array(plan.weight[rows], pa.float64()))
    )
    removed = plan.removed[rows]
    kept = annotated.filter(pa.array(~removed))
    rejected = with_quarantine_reason(base.filter(pa.array(removed)), STAGE, list(plan.reason[rows][removed]))
    rejected = rejected.append_column("duplicate_of", pa.array(plan.duplicate_of[rows][removed], pa.string()))
    rejected = rejected.append_column("dup_cluster", pa.array(plan.dup_cluster[rows][removed], pa.string()))
    return kept, rejected


def deduplicate(
    tables: list[pa.Table], config: DedupConfig, published: PublishedIndex | None = None
) -> tuple[pa.Table, pa.Table, DedupPlan]:
    """Plan and apply over in-memory tables: (kept, quarantined, plan)."""
    plan = plan_dedup(tables, config, published)
    kept, quarantined, start = [], [], 0
    for table in tables:
        k, q = apply_plan(table, plan, start)
        kept.append(k)
        quarantined.append(q)
        start += table.num_rows
    return (
        pa.concat_tables(kept, promote_options="default"),
        pa.concat_tables(quarantined, promote_options="default"),
        plan,
    )


@dataclass
class _Documents:
    """Every document considered: the input rows first (in input order), then the published
    documents that are not in the input. An input row whose id and text are in the index is
    a published document; an index entry whose id is in the input with another text is
    superseded and left out."""

    ids: np.ndarray
    sources: np.ndarray
    keys: np.ndarray
    quality: np.ndarray
    published: np.ndarray

    @classmethod
    def of(cls, scan: _Scan, published: PublishedIndex) -> _Documents:
        matched = _positions(scan.ids, published.ids)
        published_input = np.zeros(len(scan.ids), bool)
        in_index = np.flatnonzero(matched >= 0)
        published_input[in_index] = published.content_keys[matched[in_index]] == scan.keys[in_index]
        only = ~_member(published.ids, scan.ids)
        quality = np.concatenate([scan.quality, published.quality[only]])
        return cls(
            ids=np.concatenate([scan.ids, published.ids[only]]),
            sources=np.concatenate([scan.sources, published.sources[only]]),
            keys=np.concatenate([scan.keys, published.content_keys[only]]),
            quality=np.where(np.isfinite(quality), quality, -np.inf),
            published=np.concatenate([published_input, np.ones(int(only.sum()), bool)]),
        )


@dataclass
class _Scan:
    ids: np.ndarray
    sources: np.ndarray
    keys: np.ndarray
    quality: np.ndarray
    new_keys: np.ndarray
    new_signatures: np.ndarray
    shingled_bytes: int


def _scan(parts: Iterable[pa.Table], config: DedupConfig, known: set[bytes]) -> _Scan:
    """Content keys of every row; a signature for every content not in ``known`` (once per content)."""
    ids, sources, keys, quality, new_keys, new_signatures = [], [], [], [], [], []
    shingled = 0
    for table in parts:
        missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
        if missing:
            raise ValueError(
                f"an input part lacks column(s) {', '.join(missing)}; dedup reads the filtered stage"
            )
        texts = table.column("text").combine_chunks()
        for first, stop in _byte_batches(texts, config.batch_bytes):
            batch = texts.slice(first, stop - first)
            batch_keys = content_keys(batch)
            to_hash = []
            for row, key in enumerate(batch_keys.tolist()):
                if key not in known:
                    known.add(key)
                    to_hash.append(row)
            keys.append(batch_keys)
            if not to_hash:
                continue
            if len(to_hash) < len(batch):  # hash each new text once
                batch = batch.take(pa.array(to_hash, pa.int64()))
            hashes, offsets = shingle_hashes(batch, config.ngram)
            new_signatures.append(signatures(hashes, offsets, config.num_perm, config.seed))
            new_keys.append(batch_keys[to_hash])
            shingled += int(pc.sum(pc.binary_length(batch)).as_py() or 0)
        ids.append(table.column("id").to_numpy(zero_copy_only=False).astype(object))
        sources.append(table.column("source").to_numpy(zero_copy_only=False).astype(object))
        quality.append(_quality(table, config.quality_column))
    return _Scan(
        ids=np.concatenate(ids) if ids else np.zeros(0, object),
        sources=np.concatenate(sources) if sources else np.zeros(0, object),
        keys=np.concatenate(keys) if keys else np.zeros(0, "S16"),
        quality=np.concatenate(quality) if quality else np.zeros(0),
        new_keys=np.concatenate(new_keys) if new_keys else np.zeros(0, "S16"),
        new_signatures=np.concatenate(new_signatures)
        if new_signatures
        else np.zeros((0, config.num_perm), np.uint32),
        shingled_bytes=shingled,
    )


def keys_to_arrow(keys: np.ndarray) -> pa.Array:
    """16-byte keys as ``binary(16)``, byte for byte (NumPy's ``tolist`` would strip trailing zero bytes)."""
    data = np.ascontiguousarray(keys, "S16").tobytes()
    return pa.Array.from_buffers(pa.binary(16), len(keys), [None, pa.py_buffer(data)])


def keys_from_arrow(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    return np.frombuffer(array.buffers()[1], "S16", len(array), array.offset * 16).copy()


def _byte_batches(texts: pa.Array, batch_bytes: int) -> Iterator[tuple[int, int]]:
    """Row ranges of about ``batch_bytes`` of text (at least one row each)."""
    if len(texts) == 0:
        return
    ends = np.cumsum(pc.fill_null(pc.binary_length(texts), 0).to_numpy(zero_copy_only=False))
    start = 0
    while start < len(texts):
        base = ends[start - 1] if start else 0
        stop = max(int(np.searchsorted(ends, base + batch_bytes, side="right")), start + 1)
        yield start, stop
        start = stop


def _quality(table: pa.Table, column: str) -> np.ndarray:
    if column not in table.column_names:
        return np.zeros(table.num_rows)
    values = pc.cast(table.column(column), pa.float64(), safe=False)
    return pc.fill_null(values, float("-inf")).to_numpy(zero_copy_only=False).astype(np.float64)


def _positions(ids: np.ndarray, universe: np.ndarray) -> np.ndarray:
    """Position of each id in ``universe`` (unique ids), or -1."""
    if len(universe) == 0:
        return np.full(len(ids), -1, np.int64)
    found = pc.index_in(pa.array(ids, pa.string()), value_set=pa.array(universe, pa.string()))
    return pc.fill_null(found, -1).to_numpy(zero_copy_only=False).astype(np.int64)


def _best_of_group(group: np.ndarray, preference: tuple[np.ndarray, ...]) -> np.ndarray:
    """For each element, the element of its group that sorts first by ``preference``
    (``np.lexsort`` keys, last key most significant)."""
    if len(group) == 0:
        return np.zeros(0, np.int64)
    order = np.lexsort((*preference, group))
    first = order[np.concatenate([[True], group[order][1:] != group[order][:-1]])]
    best = np.zeros(group.max() + 1, np.int64)
    best[group[first]] = first
    return best[group]


def _member(ids: np.ndarray, others: np.ndarray) -> np.ndarray:
    if len(ids) == 0 or len(others) == 0:
        return np.zeros(len(ids), bool)
    found = pc.is_in(pa.array(ids, pa.string()), value_set=pa.array(others, pa.string()))
    return found.to_numpy(zero_copy_only=False).astype(bool)


def _fill(target: np.ndarray, contents: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``target[i] = values[k]`` wherever ``keys[k] == contents[i]`` (contents sorted); returns
    which rows of ``target`` were filled."""
    filled = np.zeros(len(contents), bool)
    if len(keys) == 0 or len(contents) == 0:
        return filled
    at = np.minimum(np.searchsorted(contents, keys), len(contents) - 1)
    present = contents[at] == keys
    target[at[present]] = values[present]
    filled[at[present]] = True
    return filled


def _index_table(
    scan: _Scan, rows: np.ndarray, signature: np.ndarray, keys: np.ndarray, num_perm: int, bands: int
) -> pa.Table:
    flat_signature = pa.array(signature.reshape(-1), pa.uint32())
    flat_keys = pa.array(keys.reshape(-1), pa.uint64())
    return pa.Table.from_arrays(
        [
            pa.array(scan.ids[rows], pa.string()),
            pa.array(scan.sources[rows], pa.string()),
            keys_to_arrow(scan.keys[rows]),
            pa.array(scan.quality[rows], pa.float64()),
            pa.FixedSizeListArray.from_arrays(flat_signature, num_perm),
            pa.FixedSizeListArray.from_arrays(flat_keys, bands),
        ],
        schema=index_schema(num_perm, bands),
    )
