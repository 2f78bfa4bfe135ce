"""Texts cut into segments (words, lines, paragraphs) as flat Arrow/numpy arrays with the
index of the document each segment belongs to, and the repetition statistics over them.

Everything here works on a whole batch at once: no Python loop runs per word or per line.
Segments are identified by dictionary codes (pyarrow's hash-based ``dictionary_encode``),
n-grams by a polynomial hash of consecutive codes (64-bit, wrapping).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_HASH_MULTIPLIER = np.uint64(0x100000001B3)  # FNV-1a 64-bit prime
_DOC_MIX = np.uint64(0x9E3779B97F4A7C15)  # golden-ratio constant: spreads document ids across keys


@dataclass(frozen=True)
class Segments:
    """Flat segments of ``n_docs`` documents; ``doc[i]`` is the document of segment ``i``."""

    values: pa.Array  # string segments, in document order
    doc: np.ndarray  # int64, non-decreasing
    n_docs: int

    @cached_property
    def _encoded(self) -> pa.DictionaryArray:
        return self.values.dictionary_encode()

    @property
    def counts(self) -> np.ndarray:
        return np.bincount(self.doc, minlength=self.n_docs)

    def per_doc_sum(self, values: np.ndarray) -> np.ndarray:
        return np.bincount(self.doc, weights=values, minlength=self.n_docs)

    def lengths(self) -> np.ndarray:
        return np.asarray(pc.utf8_length(self.values).to_numpy(zero_copy_only=False), dtype=np.int64)

    def codes(self) -> np.ndarray:
        """Equal segments share a code (case-sensitive)."""
        return np.asarray(self._encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)

    def per_distinct(self, compute: Callable[[pa.Array], pa.Array]) -> np.ndarray:
        """``compute`` run once per distinct segment, spread back to every segment: words
        repeat a lot, so this is several times cheaper than running it on every word."""
        distinct = compute(self._encoded.dictionary).to_numpy(zero_copy_only=False)
        return distinct[self.codes()]

    def mask(self, condition: pa.Array) -> Segments:
        keep = np.asarray(condition.to_numpy(zero_copy_only=False), dtype=bool)
        return Segments(self.values.filter(pa.array(keep)), self.doc[keep], self.n_docs)


def _flatten(lists: pa.Array, n_docs: int) -> Segments:
    values = pc.list_flatten(lists)
    doc = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False).astype(np.int64)
    return Segments(values, doc, n_docs)


def split_words(texts: pa.Array) -> Segments:
    return _flatten(pc.utf8_split_whitespace(texts), len(texts))


def split_lines(texts: pa.Array) -> Segments:
    """Lines that have a non-space character."""
    lines = _flatten(pc.split_pattern(texts, "\n"), len(texts))
    return lines.mask(pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(lines.values)), 0))


def split_paragraphs(texts: pa.Array) -> Segments:
    """Blocks separated by a blank line, that have a non-space character."""
    paragraphs = _flatten(pc.split_pattern_regex(texts, "\\n[ \\t]*\\n"), len(texts))
    return paragraphs.mask(pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(paragraphs.values)), 0))


def count_bytes(texts: pa.Array, byte_table: np.ndarray) -> np.ndarray:
    """Per text, how many of its UTF-8 bytes ``byte_table`` (256 booleans) marks: a table
    lookup over the array's data buffer, much faster than a regex that matches per character."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    offset_type = np.int64 if pa.types.is_large_string(texts.type) else np.int32
    offsets = np.frombuffer(texts.buffers()[1], dtype=offset_type)[
        texts.offset : texts.offset + len(texts) + 1
    ]
    data = np.frombuffer(texts.buffers()[2], dtype=np.uint8) if texts.buffers()[2] else np.zeros(0, np.uint8)
    flags = np.take(byte_table.astype(np.uint8), data[offsets[0] : offsets[-1]])
    starts = (offsets[:-1] - offsets[0]).astype(np.int64)
    nonempty = np.diff(offsets) > 0
    counts = np.zeros(len(texts), dtype=np.int64)
    if nonempty.any():
        counts[nonempty] = np.add.reduceat(flags, starts[nonempty], dtype=np.int64)
    return counts


def ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, 0 where the denominator is 0."""
    numerator = np.asarray(numerator, dtype=np.float64)
    denominator = np.asarray(denominator, dtype=np.float64)
    out = np.zeros_like(numerator)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out


@dataclass(frozen=True)
class Repeats:
    """Per key: how many times its value occurs, and whether this is the value's first occurrence."""

    count: np.ndarray
    first: np.ndarray


def mix64(keys: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection that spreads every input bit over the high bits."""
    keys = keys.astype(np.uint64, copy=True)
    keys ^= keys >> np.uint64(30)
    keys *= np.uint64(0xBF58476D1CE4E5B9)
    keys ^= keys >> np.uint64(27)
    keys *= np.uint64(0x94D049BB133111EB)
    keys ^= keys >> np.uint64(31)
    return keys


def find_repeats(keys: np.ndarray) -> Repeats:
    """Group equal uint64 keys with one sort.

    Each key's high bits are packed with its position in the low bits, so a plain (fast)
    sort orders equal values by position, which makes the first occurrence the first of its
    run. Runs are cut on the full 64-bit values, so a collision of the truncated high bits
    never merges different values; it can only split a run (a missed repeat), with a chance
    of about n^2 / 2^(65 - log2 n) per call: ~1% for a million keys.
    """
    n = len(keys)
    if n == 0:
        return Repeats(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool))
    keys = mix64(keys)
    position_bits = np.uint64(max(n.bit_length(), 1))
    low = (np.uint64(1) << position_bits) - np.uint64(1)
    packed = np.sort((keys & ~low) | np.arange(n, dtype=np.uint64))
    position = (packed & low).astype(np.int64)
    values = keys[position]
    run_start = np.empty(n, dtype=bool)
    run_start[0] = True
    np.not_equal(values[1:], values[:-1], out=run_start[1:])
    run = np.cumsum(run_start) - 1
    count = np.empty(n, dtype=np.int64)
    count[position] = np.bincount(run)[run]
    first = np.empty(n, dtype=bool)
    first[position] = run_start
    return Repeats(count, first)


def _doc_keys(hashes: np.ndarray, doc: np.ndarray) -> np.ndarray:
    return hashes ^ (doc.astype(np.uint64) * _DOC_MIX)


def duplicate_fractions(segments: Segments) -> tuple[np.ndarray, np.ndarray]:
    """Per document: the share of segments that repeat an earlier one, and the share of
    characters in those repeats (Gopher's duplicate line / paragraph fractions)."""
    lengths = segments.lengths()
    repeat = ~find_repeats(_doc_keys(segments.codes().astype(np.uint64), segments.doc)).first
    repeated = np.bincount(segments.doc[repeat], minlength=segments.n_docs)
    repeated_chars = np.bincount(segments.doc[repeat], weights=lengths[repeat], minlength=segments.n_docs)
    return ratio(repeated, segments.counts), ratio(repeated_chars, segments.per_doc_sum(lengths))


def ngram_repetition(
    words: Segments, top_ns: tuple[int, ...], duplicate_ns: tuple[int, ...]
) -> dict[str, np.ndarray]:
    """Gopher's repetition signals over word n-grams, as fractions of each document's word characters.

    * ``top_<n>gram``: characters of the most frequent n-gram (if it occurs more than once)
      times its count.
    * ``duplicate_<n>gram``: characters of words covered by an occurrence of an n-gram that
      already occurred earlier in the document.

    An n-gram can only repeat where the (n-1)-gram at the same position repeats, so for
    growing n only those positions are hashed.
    """
    n_words = len(words.doc)
    doc = words.doc
    lengths = words.lengths()
    word_chars = words.per_doc_sum(lengths)
    codes = words.codes().astype(np.uint64) + np.uint64(1)
    starts = np.concatenate([[0], np.cumsum(words.counts)])
    room = starts[doc + 1] - np.arange(n_words)  # words from each position to the document's end
    char_prefix = np.concatenate([[0], np.cumsum(lengths)])
    signals: dict[str, np.ndarray] = {}
    hashes = codes.copy()
    candidates = np.arange(n_words)
    for n in range(2, max((*top_ns, *duplicate_ns), default=1) + 1):
        candidates = candidates[room[candidates] >= n]
        hashes_at = hashes[candidates] * _HASH_MULTIPLIER + codes[candidates + n - 1]
        hashes[candidates] = hashes_at  # positions dropped from candidates are never read again
        repeats = find_repeats(_doc_keys(hashes_at, doc[candidates]))
        repeated = repeats.count > 1
        if n in top_ns:
            firsts = candidates[repeated & repeats.first]
            chars = (char_prefix[firsts + n] - char_prefix[firsts]) * repeats.count[repeated & repeats.first]
            top = np.zeros(words.n_docs)
            np.maximum.at(top, doc[firsts], chars)
            signals[f"top_{n}gram"] = ratio(top, word_chars)
        if n in duplicate_ns:
            later = candidates[~repeats.first]
            cover = np.bincount(later, minlength=n_words + 1) - np.bincount(later + n, minlength=n_words + 1)
            covered = np.cumsum(cover[:-1]) > 0
            signals[f"duplicate_{n}gram"] = ratio(
                np.bincount(doc[covered], weights=lengths[covered], minlength=words.n_docs), word_chars
            )
        if n >= max(top_ns, default=0):
            # beyond the top-n-gram orders, only positions whose n-gram repeats can still repeat
            candidates = candidates[repeated]
    return signals
