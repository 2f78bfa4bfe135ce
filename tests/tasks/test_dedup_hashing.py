"""Dedup building blocks: shingles against a plain-Python reference, content keys, banding,
bucket pairs and union-find against independent implementations."""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components as scipy_components

from tasks.dedup.minhash import (
    bucket_pairs,
    candidate_probability,
    choose_banding,
    connected_components,
    estimated_similarity,
    signatures,
)
from tasks.dedup.shingles import content_keys, shingle_hashes

WORD = re.compile(rb"[0-9a-z_\x80-\xff]+")


def reference_shingles(text: str | None, ngram: int) -> set[tuple[bytes, ...]]:
    """The documented shingles, the slow obvious way."""
    lowered = pc.utf8_lower(pa.array([text or ""])).to_pylist()[0]
    words = WORD.findall(lowered.encode())
    if not words:
        return set()
    if len(words) < ngram:
        return {tuple(words)}
    return {tuple(words[i : i + ngram]) for i in range(len(words) - ngram + 1)}


TEXTS = [
    "The quick brown fox jumps over the lazy dog, again and again.",
    "",
    None,
    "one two",
    "Ünïcode wörds—and ЯЗЫК text; snake_case identifiers, 3.14159 numbers!",
    "x" * 300 + " tail " + "y" * 17,
    "def f(a, b):\n    return a+b  # same words as below\n",
    "DEF F(A,B): return A + B # same words as below",
    "   \t\n  ",
    "word",
    "ends with a word",
    "starts here",  # glued to the previous document's last word in the byte stream
]


@pytest.mark.parametrize("ngram", [1, 3, 5])
def test_shingles_match_the_reference_definition(ngram):
    hashes, offsets = shingle_hashes(pa.array(TEXTS), ngram)
    assert offsets[0] == 0 and offsets[-1] == len(hashes) and len(offsets) == len(TEXTS) + 1
    hash_of: dict[tuple[bytes, ...], int] = {}
    for i, text in enumerate(TEXTS):
        mine = set(hashes[offsets[i] : offsets[i + 1]].tolist())
        reference = reference_shingles(text, ngram)
        for shingle in reference:  # a shingle alone is a document with exactly that one shingle
            alone, _ = shingle_hashes(pa.array([" ".join(w.decode() for w in shingle)]), ngram)
            assert len(alone) == 1 and int(alone[0]) in mine
            assert hash_of.setdefault(shingle, int(alone[0])) == int(alone[0])
        assert len(mine) == len(reference), f"document {i}: one hash per reference shingle"
    assert len(set(hash_of.values())) == len(hash_of), "distinct shingles, distinct hashes"
    assert np.array_equal(hashes[offsets[6] : offsets[7]], hashes[offsets[7] : offsets[8]]), (
        "case and punctuation"
    )


def test_shingles_of_a_batch_equal_shingles_of_each_document():
    together, offsets = shingle_hashes(pa.array(TEXTS), 5)
    for i, text in enumerate(TEXTS):
        alone, _ = shingle_hashes(pa.array([text]), 5)
        assert np.array_equal(together[offsets[i] : offsets[i + 1]], alone)


def test_long_words_hash_all_their_bytes():
    base = "a" * 100
    variants = [base, base[:-1] + "b", "b" + base[1:], base + "a", base[:50] + "c" + base[51:]]
    hashes, _ = shingle_hashes(pa.array(variants), 1)
    assert len(set(hashes.tolist())) == len(variants)


def test_content_keys_ignore_whitespace_layout_only():
    texts = ["a  b\n\tc", " a b c ", "a b c", "A b c", "a b  c.", "", None, "   "]
    raw = content_keys(pa.array(texts)).tobytes()
    keys = [raw[i : i + 16] for i in range(0, len(raw), 16)]
    assert keys[0] == keys[1] == keys[2] == hashlib.sha256(b"a b c").digest()[:16]
    assert len({keys[2], keys[3], keys[4]}) == 3, "case and punctuation matter"
    assert keys[5] == keys[6] == keys[7] == hashlib.sha256(b"").digest()[:16]


def test_signatures_estimate_jaccard_without_bias():
    rng = np.random.default_rng(3)
    rows, truth = [], []
    for _ in range(400):
        n, j = int(rng.integers(50, 400)), float(rng.uniform(0.3, 1.0))
        shared = int(round(2 * n * j / (1 + j)))
        pool = rng.integers(0, 2**63, size=2 * n, dtype=np.uint64)
        rows += [pool[:n], np.concatenate([pool[:shared], pool[n : 2 * n - shared]])]
        truth.append(shared / (2 * n - shared))
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    signature = signatures(np.concatenate(rows), offsets, 256, seed=1)
    pairs = np.arange(0, len(rows), 2)
    error = estimated_similarity(signature, pairs, pairs + 1) - np.array(truth)
    assert abs(error.mean()) < 0.005 and error.std() < 0.035


def test_banding_catches_pairs_just_above_the_threshold():
    for threshold, num_perm in [(0.8, 256), (0.7, 128), (0.9, 256), (0.5, 64)]:
        bands, rows = choose_banding(threshold, num_perm)
        assert bands * rows <= num_perm
        assert candidate_probability(threshold + 0.05, bands, rows) >= 0.999
        if rows > 1:  # one more row would miss that target
            assert candidate_probability(threshold + 0.05, num_perm // (rows + 1), rows + 1) < 0.999
    assert choose_banding(0.8, 256) == (28, 9)


def test_bucket_pairs_are_all_pairs_of_small_buckets_and_a_band_through_big_ones():
    keys = np.array([5, 1, 5, 2, 5, 1, 9], np.uint64)
    a, b = bucket_pairs(keys, window=8)
    assert set(zip(a.tolist(), b.tolist(), strict=True)) == {(0, 2), (0, 4), (2, 4), (1, 5)}
    big = np.zeros(100, np.uint64)
    a, b = bucket_pairs(big, window=3)
    assert len(a) == 97 + 98 + 99 and np.all(b - a <= 3)
    assert scipy_components(coo_matrix((np.ones(len(a)), (a, b)), shape=(100, 100)))[0] == 1


def test_union_find_matches_scipy_connected_components():
    rng = np.random.default_rng(0)
    for n, edges in [(1000, 700), (1000, 2000), (50, 0), (5000, 4999)]:
        a = rng.integers(0, n, edges)
        b = rng.integers(0, n, edges)
        if n == 5000:  # one long chain: the worst case for label propagation
            a, b = np.arange(n - 1), np.arange(1, n)
        labels = connected_components(n, a, b)
        count, reference = scipy_components(
            coo_matrix((np.ones(len(a)), (a, b)), shape=(n, n)), directed=False
        )
        assert len(np.unique(labels)) == count
        # same partition, and each label is its component's smallest node
        assert len(np.unique(np.stack([labels, reference]), axis=1).T) == count
        assert np.all(labels <= np.arange(n)) and np.all(labels[labels] == labels)
