"""Text to dedup keys, vectorised over a whole batch (no Python loop per word or shingle).

Two keys per document:

* the **content key**, for exact duplicates: sha256 (16 bytes kept) of the text with every
  run of whitespace collapsed to one space and leading/trailing whitespace removed (case and
  punctuation kept, so code that differs in an operator is not an exact duplicate);
* the **shingle hashes**, for near duplicates: the text is lowercased (Unicode, by Arrow)
  and cut into words, a word being a maximal run of ASCII letters, digits and ``_`` or of
  non-ASCII bytes (so accented and non-Latin words stay whole; ASCII punctuation and
  whitespace separate words). A shingle is ``ngram`` consecutive words; a document with
  fewer words has one shingle of all of them, and one with no words has none.

How the shingles stay out of the interpreter: the batch's UTF-8 bytes are one NumPy array;
word boundaries come from a byte mask and ``np.diff``; a word's hash is read 8 bytes at a
time through an overlapping ``uint64`` view of the bytes (zero-masked past the word's end,
mixed with its length, so words of up to 8 bytes never collide), and a shingle hash is a
fixed linear combination of its words' hashes, finalised with splitmix64. Every step is a
whole-array NumPy operation; the only loops run over the 8-byte chunks of the longest word
and over the ``ngram`` offsets.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.text_bytes import large_strings, mix64, runs, span_hashes, utf8_bytes

SHINGLE_VERSION = 1
"""Bump when the shingles or their hashes change: signatures stored in the index depend on them."""

# one odd multiplier per position inside a shingle (splitmix64 outputs, forced odd)
_POSITION_MULTIPLIERS = np.array(
    [
        0xE220A8397B1DCDAF,
        0x6E789E6AA1B965F5,
        0x06C45D188009454F,
        0xF88BB8A8724C81EB,
        0x9B4E8CE2C5AF2C15,
        0xD4B9E0D0ACE5AB2B,
        0x4C12B1A9E5C8D3B1,
        0x2F6A93B5F1D0E7C9,
    ],
    np.uint64,
)
MAX_NGRAM = len(_POSITION_MULTIPLIERS)


def content_keys(texts: pa.Array) -> np.ndarray:
    """sha256 (first 16 bytes) of each whitespace-normalised text, as a ``(n,)`` array of 16-byte strings.

    Whitespace here is any byte <= 0x20 (space, tab, newlines and other control characters).
    """
    data, offsets = utf8_bytes(texts)
    space = data <= 32
    previous_space = np.empty_like(space)
    previous_space[:1] = True
    previous_space[1:] = space[:-1]
    previous_space[offsets[:-1][offsets[:-1] < len(data)]] = True  # a document starts after "whitespace"
    keep = ~(space & previous_space)  # drop leading and repeated whitespace
    normalised = np.maximum(data, np.uint8(32))[keep]
    kept_before = np.zeros(
        len(data) + 1, np.int32 if len(data) < 2**31 else np.int64
    )  # int32: half the traffic
    np.cumsum(keep, out=kept_before[1:])
    starts, ends = kept_before[offsets[:-1]], kept_before[offsets[1:]]
    kept = ends - starts
    if len(normalised):  # one space is left where a document ends in whitespace
        ends -= (kept > 0) & (normalised[np.maximum(ends - 1, 0)] == 32)
    view = memoryview(normalised)
    keys = [
        hashlib.sha256(view[a:b]).digest()[:16] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)
    ]
    return np.array(keys, dtype="S16") if keys else np.zeros(0, "S16")


def _word_mask(data: np.ndarray) -> np.ndarray:
    """Word bytes of lowercased UTF-8: a-z, 0-9, '_' and every byte of a non-ASCII character."""
    lower_letter = (data - np.uint8(ord("a"))) < 26
    digit = (data - np.uint8(ord("0"))) < 10
    return lower_letter | digit | (data >= 0x80) | (data == ord("_"))


def words(texts: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(lowercased bytes, word starts, word ends, document of each word), words in text order."""
    lowered = pc.utf8_lower(large_strings(texts))
    data, offsets = utf8_bytes(lowered)
    return (data, *runs(_word_mask(data), offsets))


def shingle_hashes(texts: pa.Array, ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """(uint64 shingle hashes of all documents, int64 row offsets: document i owns ``[o[i], o[i+1])``)."""
    if not 1 <= ngram <= MAX_NGRAM:
        raise ValueError(f"ngram is {ngram}; it must be between 1 and {MAX_NGRAM}")
    data, starts, ends, doc = words(texts)
    n_docs = len(texts)
    hashes = span_hashes(data, starts, ends)
    per_doc = np.bincount(doc, minlength=n_docs)
    first_word = np.concatenate([[0], np.cumsum(per_doc)[:-1]])

    count = max(len(hashes) - ngram + 1, 0)
    combined = hashes[:count] * _POSITION_MULTIPLIERS[0]
    for j in range(1, ngram):
        combined += hashes[j : j + count] * _POSITION_MULTIPLIERS[j]
    whole = np.flatnonzero(doc[:count] == doc[ngram - 1 : ngram - 1 + count])
    full_hashes, full_docs = mix64(combined[whole]), doc[whole]

    short = np.flatnonzero((per_doc > 0) & (per_doc < ngram))  # one shingle of all their words
    short_combined = np.zeros(len(short), np.uint64)
    for j in range(ngram - 1):
        has = j < per_doc[short]
        short_combined[has] += hashes[first_word[short[has]] + j] * _POSITION_MULTIPLIERS[j]
    at = np.searchsorted(full_docs, short)
    all_hashes = np.insert(full_hashes, at, mix64(short_combined ^ per_doc[short].astype(np.uint64)))
    all_docs = np.insert(full_docs, at, short)
    offsets = np.searchsorted(all_docs, np.arange(n_docs + 1))
    return all_hashes, offsets.astype(np.int64)
