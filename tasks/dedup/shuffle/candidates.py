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
    CONTENT_KEYS,
    DOCS,
    NEEDS,
    PAIRS,
    ROWS,
    Bucket,
    BucketWriter,
    Part,
    ShuffleRun,
    SlicedInput,
    StreamedFile,
    band_schema,
    batch_content_keys,
    halves_schema,
    matrix,
    read_input,
    signature_array,
    signature_schema,
    slice_of_band_key,
    slice_of_content,
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
    """Each live content's signature (new or published) and band keys, slice by slice."""
    run, config = bucket.run, bucket.run.config
    by_content = slice_of_content("content_key")
    inputs = [
        SlicedInput(run.at("docs", bucket.bucket), CONTENT_KEYS, by_content),
        SlicedInput(run.at("signatures", bucket.bucket), signature_schema(config.num_perm), by_content),
    ]
    counts = {"contents": 0, "band_keys_reused": 0, "bucket_slices": 0}
    with (
        StreamedFile(run.repo, run.branch, bucket_file(run.index_run, "contents", bucket.bucket)) as index,
        StreamedFile(run.repo, run.branch, run.at("live", bucket.bucket, "signatures")) as live_out,
        BucketWriter(run, "bands", bucket.producer) as bands_out,
    ):
        for s, slices, (docs, new) in run.in_slices(inputs):
            published, usable = published_contents(
                run.repo, run.input_commit, list(run.published), bucket.bucket, run.buckets, config.banding
            )
            if slices > 1 and published.num_rows:
                mine = by_content(published, slices) == s
                published, usable = published.filter(pa.array(mine)), usable[mine]
            live = np.unique(keys_from_arrow(docs.column("content_key")))
            slice_counts = _contents_of_slice(
                run, bucket, live, new, published, usable, index, live_out, bands_out
            )
            for key, value in slice_counts.items():
                counts[key] += value
            counts["bucket_slices"] += 1
    return counts


def _contents_of_slice(
    run: ShuffleRun,
    bucket: Bucket,
    live: np.ndarray,
    new: pa.Table,
    published: pa.Table,
    usable: np.ndarray,
    index: StreamedFile,
    live_out: StreamedFile,
    bands_out: BucketWriter,
) -> dict[str, int]:
    config = run.config
    bands, rows_per_band = config.banding
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
    fresh = np.zeros(len(live), bool)
    if new.num_rows:
        at = np.searchsorted(live, keys_from_arrow(new.column("content_key")))
        signature[at] = matrix(new.column("signature"), config.num_perm)
        fresh[at] = ~found[at]
        found[at] = True
    if not found.all():
        raise AssertionError(
            f"dedup bucket {bucket.bucket}: {int((~found).sum())} contents have no signature"
        )
    keys[~stored] = band_keys(signature[~stored], bands, rows_per_band)
    if fresh.any():
        index.write(
            pa.table(
                {
                    "content_key": keys_to_arrow(live[fresh]),
                    "signature": signature_array(signature[fresh]),
                    "band_keys": pa.FixedSizeListArray.from_arrays(
                        pa.array(keys[fresh].reshape(-1), pa.uint64()), bands
                    ),
                }
            )
        )
    eligible = ~np.all(signature == EMPTY_SLOT, axis=1)  # no shingles: exact matches only
    live_out.write(
        pa.table(
            [keys_to_arrow(live[eligible]), signature_array(signature[eligible])],
            schema=signature_schema(config.num_perm),
        )
    )
    n = int(eligible.sum())
    del signature
    band_key = keys[eligible].reshape(-1)
    records = pa.table(
        [
            pa.array(np.repeat(np.arange(bands, dtype=np.int32)[None, :], n, axis=0).reshape(-1)),
            pa.array(band_key),
            keys_to_arrow(np.repeat(live[eligible], bands)),
        ],
        schema=band_schema(),
    )
    bands_out.write(records, (band_key % np.uint64(run.buckets)).astype(np.int64))
    return {"contents": len(live), "band_keys_reused": int(stored.sum())}


# ---- 6-8: pairs, attach, verify, components ------------------------------------------------


def pairs_step(bucket: Bucket) -> dict[str, int]:
    """Candidate pairs of one band-key bucket, by the window rule over content-key order."""
    run = bucket.run
    by_band_key = slice_of_band_key(run.buckets)
    slices = 0
    with BucketWriter(run, "pairs", bucket.producer) as pairs_out:
        for _, _, (records,) in run.in_slices(
            [SlicedInput(run.at("bands", bucket.bucket), band_schema(), by_band_key)]
        ):
            slices += 1
            a, b = _pairs_of_slice(records, run.config.bucket_window)
            pairs_out.write(
                pa.table([keys_to_arrow(a), keys_to_arrow(b)], schema=PAIRS), content_buckets(a, run.buckets)
            )
    return {"bucket_slices": slices}


def _pairs_of_slice(records: pa.Table, window: int) -> tuple[np.ndarray, np.ndarray]:
    content = keys_from_arrow(records.column("content_key"))
    band = records.column("band").to_numpy()
    key = records.column("key").to_numpy()
    order = np.lexsort((content, key, band))
    band, key, content = band[order], key[order], content[order]
    left, right = [], []
    for distance in range(1, window + 1):
        same = (band[distance:] == band[:-distance]) & (key[distance:] == key[:-distance])
        if not same.any():
            break
        left.append(content[:-distance][same])
        right.append(content[distance:][same])
    if not left:
        return np.zeros(0, "S16"), np.zeros(0, "S16")
    return _split(np.unique(np.concatenate([_pair_codes(x, y) for x, y in zip(left, right, strict=True)])))


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


def _signatures_of(live: pa.Table, keys: np.ndarray, num_perm: int) -> np.ndarray:
    """The live signature of each of ``keys`` (every one is live: pairs join live contents); the
    live file is in slice order, not sorted, so this looks keys up by hash."""
    at = pc.index_in(keys_to_arrow(keys), value_set=live.column("content_key"))
    if at.null_count:
        raise AssertionError(f"{at.null_count} paired contents have no live signature")
    return matrix(live.column("signature").take(at), num_perm)


def attach_step(bucket: Bucket) -> dict[str, int]:
    """Unique candidate pairs whose first content is in this bucket, with its signature."""
    run, num_perm = bucket.run, bucket.run.config.num_perm
    inputs = [
        SlicedInput(run.at("pairs", bucket.bucket), PAIRS, slice_of_content("a")),
        SlicedInput(
            run.at("live", bucket.bucket), signature_schema(num_perm), slice_of_content("content_key")
        ),
    ]
    candidates = slices = 0
    with BucketWriter(run, "halves", bucket.producer) as halves_out:
        for _, _, (pairs, live) in run.in_slices(inputs):
            slices += 1
            if pairs.num_rows == 0:
                continue
            a, b = _split(
                np.unique(_pair_codes(keys_from_arrow(pairs.column("a")), keys_from_arrow(pairs.column("b"))))
            )
            del pairs
            half = pa.table(
                [keys_to_arrow(a), keys_to_arrow(b), signature_array(_signatures_of(live, a, num_perm))],
                schema=halves_schema(num_perm),
            )
            halves_out.write(half, content_buckets(b, run.buckets))
            candidates += len(a)
    return {"candidate_pairs": candidates, "bucket_slices": slices}


def verify_step(bucket: Bucket) -> dict[str, int]:
    run, config = bucket.run, bucket.run.config
    inputs = [
        SlicedInput(run.at("halves", bucket.bucket), halves_schema(config.num_perm), slice_of_content("b")),
        SlicedInput(
            run.at("live", bucket.bucket), signature_schema(config.num_perm), slice_of_content("content_key")
        ),
    ]
    verified_pairs = slices = 0
    with StreamedFile(run.repo, run.branch, run.at("edges", bucket.bucket, "edges")) as edges_out:
        for _, _, (halves, live) in run.in_slices(inputs):
            slices += 1
            if halves.num_rows == 0:
                continue
            first = matrix(halves.column("signature_a"), config.num_perm)
            second = _signatures_of(live, keys_from_arrow(halves.column("b")), config.num_perm)
            # as tasks.dedup.minhash.estimated_similarity, in row blocks to bound the comparison
            similarity = np.empty(halves.num_rows, np.float64)
            for start in range(0, halves.num_rows, 8192):
                stop = start + 8192
                similarity[start:stop] = (first[start:stop] == second[start:stop]).mean(axis=1)
            verified = similarity >= config.threshold
            edges_out.write(halves.select(["a", "b"]).filter(pa.array(verified)))
            verified_pairs += int(verified.sum())
    return {"verified_pairs": verified_pairs, "bucket_slices": slices}
