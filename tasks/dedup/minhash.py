"""MinHash signatures, LSH banding, candidate pairs, verification and union-find clustering.

Signatures come from ``rensa`` (``RMinHash``, Rust) fed with the shingle hashes of
:mod:`tasks.dedup.shingles` as one flat buffer per batch, so no Python object per shingle is
ever made. Everything after the signatures is NumPy over whole arrays, organised so each
step can run partitioned: band keys per partition of documents, a group-by on each band's
keys (the bands are independent), verification per candidate pair, and union-find over the
verified pairs.

Choice of bands x rows. A pair with Jaccard similarity ``s`` shares at least one band with
probability ``1 - (1 - s**r)**b``. Candidates are verified afterwards (the fraction of equal
signature values must reach the threshold), so a false candidate costs one comparison while
a missed candidate is a duplicate kept for good. We therefore take the most selective
banding (the largest ``r``, with ``b = num_perm // r``) under which a pair ``0.05`` above the
threshold becomes a candidate with probability at least ``0.999``. For the defaults
(threshold 0.8, 256 permutations) that is 28 bands of 9 rows: P(candidate) = 0.9994 at 0.85,
0.68 at 0.7 (then rejected by verification) and 1.4e-5 at 0.2.
"""

from __future__ import annotations

import numpy as np
import rensa

from tasks.dedup.shingles import mix64

RECALL_MARGIN = 0.05
CANDIDATE_PROBABILITY = 0.999
RENSA_ALGORITHM = int(getattr(rensa.RMinHash, "ALGORITHM_VERSION", 0))
"""Part of the index's parameters: signatures made by another rensa algorithm do not compare."""
EMPTY_SLOT = np.uint32(0xFFFFFFFF)


def candidate_probability(similarity: float, bands: int, rows: int) -> float:
    """P(a pair of this Jaccard similarity shares at least one band)."""
    return 1.0 - (1.0 - similarity**rows) ** bands


def choose_banding(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows): the largest ``rows`` that still catches pairs at threshold + margin (see module doc)."""
    target = min(threshold + RECALL_MARGIN, 1.0)
    for rows in range(num_perm, 0, -1):
        bands = num_perm // rows
        if candidate_probability(target, bands, rows) >= CANDIDATE_PROBABILITY:
            return bands, rows
    return num_perm, 1


def signatures(hashes: np.ndarray, row_offsets: np.ndarray, num_perm: int, seed: int) -> np.ndarray:
    """``(documents, num_perm)`` uint32 MinHash signatures; a document without shingles is all EMPTY_SLOT."""
    n_docs = len(row_offsets) - 1
    if n_docs == 0:
        return np.zeros((0, num_perm), np.uint32)
    matrix = rensa.RMinHash.digest_matrix_from_flat_token_hashes(
        np.ascontiguousarray(hashes, np.uint64), np.ascontiguousarray(row_offsets, np.uint64), num_perm, seed
    )
    return np.array(matrix.to_rows(), dtype=np.uint32).reshape(n_docs, num_perm)


def band_keys(signature: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """``(documents, bands)`` uint64: one hash of each band's ``rows`` signature values."""
    keys = np.empty((signature.shape[0], bands), np.uint64)
    for band in range(bands):
        key = np.full(signature.shape[0], np.uint64(band), np.uint64)
        for column in range(band * rows, (band + 1) * rows):
            key = mix64(key ^ signature[:, column].astype(np.uint64))
        keys[:, band] = key
    return keys


def bucket_pairs(keys: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Pairs ``(i, j)``, ``i < j``, of rows with equal keys: the group-by of one band.

    Inside a bucket (rows sharing a key, in row order), each row is paired with the next
    ``window`` rows: all pairs for buckets of up to ``window + 1`` rows, and a band of width
    ``window`` through bigger buckets (whose rows are then linked through their neighbours),
    so a bucket of thousands of copies costs O(size * window), not O(size**2).
    """
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    same_as_next = ordered[1:] == ordered[:-1]
    in_bucket = np.zeros(len(keys), bool)
    in_bucket[:-1] |= same_as_next
    in_bucket[1:] |= same_as_next
    members = order[in_bucket]
    member_keys = ordered[in_bucket]
    left, right = [], []
    for distance in range(1, window + 1):
        same = member_keys[distance:] == member_keys[:-distance]
        if not same.any():
            break
        left.append(members[:-distance][same])
        right.append(members[distance:][same])
    if not left:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    a, b = np.concatenate(left), np.concatenate(right)
    return np.minimum(a, b), np.maximum(a, b)


def candidate_pairs(keys: np.ndarray, eligible: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Unique pairs of eligible rows that share a key in any band (``keys`` is ``(rows, bands)``)."""
    rows = np.flatnonzero(eligible)
    codes = []
    for band in range(keys.shape[1]):
        a, b = bucket_pairs(keys[rows, band], window)
        codes.append(rows[a] * len(keys) + rows[b])
    unique = np.unique(np.concatenate(codes)) if codes else np.zeros(0, np.int64)
    return unique // max(len(keys), 1), unique % max(len(keys), 1)


def estimated_similarity(
    signature: np.ndarray, a: np.ndarray, b: np.ndarray, chunk: int = 8192
) -> np.ndarray:
    """Fraction of equal signature values of each pair: an unbiased estimate of their Jaccard similarity."""
    out = np.empty(len(a), np.float64)
    for start in range(0, len(a), chunk):
        stop = start + chunk
        out[start:stop] = (signature[a[start:stop]] == signature[b[start:stop]]).mean(axis=1)
    return out


def connected_components(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Union-find over edges ``(a[k], b[k])``: the label of each node is its component's smallest node.

    Vectorised union by minimum label with full path compression: each round hooks the root
    of every edge's larger side under the smaller root (``np.minimum.at`` settles several
    hooks on one root), then compresses every path by pointer jumping; it stops when every
    edge joins two nodes of one root. Labels never increase, so no cycle can form.
    """
    parent = np.arange(n, dtype=np.int64)
    while True:
        root_a, root_b = parent[a], parent[b]
        differ = root_a != root_b
        if not differ.any():
            return parent
        low = np.minimum(root_a[differ], root_b[differ])
        high = np.maximum(root_a[differ], root_b[differ])
        np.minimum.at(parent, high, low)
        while True:
            jumped = parent[parent]
            if np.array_equal(jumped, parent):
                break
            parent = jumped
