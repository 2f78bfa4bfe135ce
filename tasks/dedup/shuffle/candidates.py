"""Steps 1-7 of the dedup shuffle: content keys, signatures and band keys, candidate pairs, verified edges."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.dedup.index import (
    bucket_file,
    content_buckets,
    id_buckets,
    published_contents,
    published_documents,
)
from tasks.dedup.minhash import EMPTY_SLOT, band_keys, signatures
from tasks.dedup.plan import _byte_batches, _quality, keys_from_arrow, keys_to_arrow
from tasks.dedup.shingles import shingle_hashes
from tasks.dedup.shuffle.scratch import (
    DOCS,
    KEY,
    NEEDS,
    PAIRS,
    ROWS,
    Bucket,
    Part,
    ShuffleRun,
    band_schema,
    batch_content_keys,
    matrix,
    read_input,
    signature_array,
    signature_schema,
)
from tasks.parts import put_table

# ---- 1-3: keys, needs, signatures ----------------------------------------------------------


def keys_step(part: Part) -> dict[str, int]:
    run = part.run
    table = read_input(part)
    keys = batch_content_keys(table.column("text").combine_chunks(), run.config.batch_bytes)
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
    table = read_input(part)
    texts = table.column("text").combine_chunks()
    keys = batch_content_keys(texts, config.batch_bytes)
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
        [keys_to_arrow(keys[rows]), signature_array(signature)], schema=signature_schema(config.num_perm)
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
        signature[at[hit]] = matrix(published.column("signature"), config.num_perm)[hit]
        found[at[hit]] = True
        with_keys = hit & usable
        if with_keys.any():
            keys[at[with_keys]] = matrix(published.column("band_keys").filter(pa.array(with_keys)), bands)
            stored[at[with_keys]] = True
    if new.num_rows:
        at = np.searchsorted(live, keys_from_arrow(new.column("content_key")))
        signature[at] = matrix(new.column("signature"), config.num_perm)
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
                    "signature": signature_array(signature[fresh]),
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
            [keys_to_arrow(live[eligible]), signature_array(signature[eligible])],
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
    return keys_from_arrow(live.column("content_key")), matrix(live.column("signature"), run.config.num_perm)


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
        [keys_to_arrow(a), keys_to_arrow(b), signature_array(signature[np.searchsorted(live, a)])],
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
    first = matrix(halves.column("signature_a"), config.num_perm)
    second_rows = np.searchsorted(live, keys_from_arrow(halves.column("b")))
    similarity = np.empty(halves.num_rows, np.float64)
    for start in range(0, halves.num_rows, 8192):  # as tasks.dedup.minhash.estimated_similarity
        stop = start + 8192
        similarity[start:stop] = (first[start:stop] == signature[second_rows[start:stop]]).mean(axis=1)
    verified = similarity >= config.threshold
    run.put(run.at("edges", bucket.bucket, "edges"), halves.select(["a", "b"]).filter(pa.array(verified)))
    return {"verified_pairs": int(verified.sum())}
