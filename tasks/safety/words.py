"""Words and word n-grams as 64-bit hashes, vectorised over a whole batch.

A word is a maximal run of letters and digits after lower-casing (Unicode classes ``\\pL``
and ``\\pN``), so case, whitespace and punctuation do not change a document's n-grams.
Strings are hashed in numpy (a polynomial over their UTF-8 bytes, then the splitmix64
finaliser), never one Python call per word; an n-gram's hash combines its words' hashes
the same way. The hashes are stable across processes and machines (no salted ``hash()``),
so a benchmark set built in the flow matches documents checked in any worker.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SEPARATORS = r"[^\pL\pN]+"  # RE2 (pyarrow): everything that is not a letter or a digit
PY_WORD = re.compile(r"[^\W_]+")  # the same words for Python's re: letters and digits
BYTE_BASE = np.uint64(0x100000001B3)
WORD_BASE = np.uint64(0x9E3779B97F4A7C15)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: spreads a polynomial hash over all 64 bits."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _powers(base: np.uint64, count: int) -> np.ndarray:
    """``base**0 .. base**(count-1)`` modulo 2**64 (numpy's integer products wrap)."""
    powers = np.full(max(count, 1), base, np.uint64)
    powers[0] = 1
    with np.errstate(over="ignore"):
        return np.cumprod(powers, dtype=np.uint64)


_POWER_CACHE: dict[int, np.ndarray] = {}


def _byte_powers(count: int) -> np.ndarray:
    size = 1 << max(count - 1, 1).bit_length()
    if size not in _POWER_CACHE:
        _POWER_CACHE[size] = _powers(BYTE_BASE, size)
    return _POWER_CACHE[size]


def string_hashes(values: pa.Array) -> np.ndarray:
    """A stable 64-bit hash of each (non-null, non-empty) string."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if len(values) == 0:
        return np.empty(0, np.uint64)
    offset_type = np.int64 if pa.types.is_large_string(values.type) else np.int32
    offsets = np.frombuffer(values.buffers()[1], offset_type)[values.offset : values.offset + len(values) + 1]
    data = np.frombuffer(values.buffers()[2], np.uint8)[offsets[0] : offsets[-1]].astype(np.uint64)
    offsets = (offsets - offsets[0]).astype(np.int64)
    lengths = np.diff(offsets)
    # byte k of a string of length L weighs BYTE_BASE**(L-1-k): its distance from the string's end
    ends = np.repeat(offsets[1:], lengths)
    distance = ends - 1 - np.arange(len(data), dtype=np.int64)
    with np.errstate(over="ignore"):
        terms = data * _byte_powers(int(lengths.max()))[distance]
        sums = np.add.reduceat(terms, offsets[:-1]) + lengths.astype(np.uint64)
    return _mix(sums)


def word_hashes(words: pa.Array) -> np.ndarray:
    """:func:`string_hashes` of every word, each distinct word hashed once (dictionary-encoded
    first: a corpus repeats its words, so this hashes a small fraction of the bytes)."""
    if len(words) == 0:
        return np.empty(0, np.uint64)
    encoded = pc.dictionary_encode(words)
    indices = np.asarray(encoded.indices, np.int64)
    return string_hashes(encoded.dictionary)[indices]


def batch_words(texts: pa.Array) -> pa.ListArray:
    """Each text's words, lower-cased (one list per text; no empty words, so leading or
    trailing punctuation does not shift a text's n-grams)."""
    spaced = pc.utf8_trim_whitespace(pc.replace_substring_regex(pc.utf8_lower(texts), SEPARATORS, " "))
    words = pc.utf8_split_whitespace(spaced.fill_null(""))
    flat = words.flatten()
    present = np.asarray(pc.greater(pc.utf8_length(flat), 0).fill_null(False), bool)
    if present.all():
        return words
    lengths = np.asarray(words.value_lengths().fill_null(0), np.int64)
    list_of = np.repeat(np.arange(len(lengths)), lengths)
    kept = np.bincount(list_of[present], minlength=len(lengths))
    offsets = np.concatenate([[0], np.cumsum(kept)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), flat.filter(pa.array(present)))


def ngram_hashes(word_hashes: np.ndarray, lengths: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(hashes, starts)`` of every n-gram that lies inside one text: ``starts`` index the first
    word in ``word_hashes``, the flat words of texts with ``lengths`` words each."""
    total = len(word_hashes)
    if total < n:
        return np.empty(0, np.uint64), np.empty(0, np.int64)
    count = total - n + 1
    with np.errstate(over="ignore"):
        hashes = np.zeros(count, np.uint64)
        for j in range(n):  # n vector operations, whatever the batch size
            hashes = hashes * WORD_BASE + word_hashes[j : j + count]
    ends = np.cumsum(lengths)  # one past each text's last word
    text_of = np.repeat(np.arange(len(lengths)), lengths)[:count]
    inside = np.arange(count) + n <= ends[text_of]
    return _mix(hashes[inside]), np.flatnonzero(inside)


def text_words(text: str) -> list[re.Match]:
    """One text's words with their character spans (Python's re, for cutting spans out)."""
    return list(PY_WORD.finditer(text))
