"""Words and word n-grams as 64-bit hashes, vectorised over a whole batch.

A word is a maximal run of letters and digits after lower-casing (``str.isalnum``, what
Python's ``[^\\W_]`` matches), so case, whitespace and punctuation do not change a document's
n-grams.

How it stays out of the interpreter: the batch's UTF-8 bytes are one NumPy array. ASCII
texts (most of a corpus) need nothing more: a lookup table lower-cases the word bytes
(``[A-Za-z0-9]``) and zeroes the others. A text with any non-ASCII character is lower-cased by
Arrow (``utf8_lower``) first, and the bytes of its non-ASCII characters that are no letter or
digit are zeroed too (their code points decoded in NumPy, looked up in a table of
``str.isalnum``). Word boundaries
come from that byte mask (:func:`tasks.text_bytes.runs`), a word's hash from its bytes
(:func:`tasks.text_bytes.span_hashes`), and an n-gram's hash from its words' hashes by a
polynomial computed with one prefix sum. The hashes are stable across processes and
machines (no salted ``hash()``), so a benchmark set built in the flow matches documents
checked in any worker.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.text_bytes import large_strings, mix64, runs, span_hashes, utf8_bytes

PY_WORD = re.compile(r"[^\W_]+")  # the same words for Python's re: letters and digits
WORD_BASE = 0x9E3779B97F4A7C15  # odd, so invertible modulo 2**64
WORD_BASE_INVERSE = pow(WORD_BASE, -1, 1 << 64)

_WORD_BYTE = np.zeros(256, bool)
for _first, _last in (("0", "9"), ("a", "z"), ("A", "Z")):
    _WORD_BYTE[ord(_first) : ord(_last) + 1] = True
_WORD_BYTE[0x80:] = True  # non-ASCII bytes are left only inside words (see the module docstring)
_LOWER_WORD = np.where(_WORD_BYTE, np.arange(256), 0).astype(np.uint8)  # a word byte lower-cased, else 0
_LOWER_WORD[ord("A") : ord("Z") + 1] += 32


@dataclass(frozen=True)
class Words:
    """The words of a batch of texts, in order: their hashes, the text each belongs to, and
    where their lower-cased bytes are (to spell an n-gram back out)."""

    hashes: np.ndarray  # uint64, one per word
    text_of: np.ndarray  # int64, the index of the word's text in the batch
    data: np.ndarray  # lower-cased bytes of the batch
    starts: np.ndarray
    ends: np.ndarray

    def lengths(self, texts: int) -> np.ndarray:
        """Words per text."""
        return np.bincount(self.text_of, minlength=texts)

    def spell(self, first: int, count: int) -> str:
        """Words ``first .. first + count - 1`` joined by spaces."""
        spans = zip(
            self.starts[first : first + count].tolist(),
            self.ends[first : first + count].tolist(),
            strict=True,
        )
        return " ".join(self.data[a:b].tobytes().decode("utf-8", "replace") for a, b in spans)


def batch_words(texts: pa.Array) -> Words:
    """Every word of every text (a null text has none)."""
    texts = large_strings(texts)
    ascii_ = np.asarray(pc.string_is_ascii(texts), bool)
    if not ascii_.all():
        other = pa.array(~ascii_)
        texts = pc.replace_with_mask(texts, other, pc.utf8_lower(texts.filter(other)))
    data, offsets = utf8_bytes(texts)
    lowered = _LOWER_WORD[data]  # one gather for both: the word bytes lower-cased, the others 0
    if not ascii_.all():
        _drop_other_characters(data, lowered)
    starts, ends, text_of = runs(lowered != 0, offsets)
    return Words(span_hashes(lowered, starts, ends), text_of, lowered, starts, ends)


@functools.cache
def _alnum() -> np.ndarray:
    """Per code point: a letter or digit (``str.isalnum``, what ``PY_WORD`` matches)."""
    return np.fromiter((chr(c).isalnum() for c in range(0x110000)), bool, 0x110000)


def _drop_other_characters(data: np.ndarray, lowered: np.ndarray) -> None:
    """Zero in ``lowered`` every byte of each non-ASCII character that is no letter or digit."""
    leads = np.flatnonzero(data >= 0xC0)
    if not len(leads):
        return
    size = np.where(data[leads] >= 0xF0, 4, np.where(data[leads] >= 0xE0, 3, 2))
    padded = np.zeros(len(data) + 3, np.int64)
    padded[: len(data)] = data
    point = padded[leads] & np.where(size == 4, 0x07, np.where(size == 3, 0x0F, 0x1F))
    for k in range(1, 4):
        more = size > k
        point = np.where(more, (point << 6) | (padded[leads + k] & 0x3F), point)
    other = ~_alnum()[np.minimum(point, 0x10FFFF)]
    for k in range(4):
        at = leads[other & (size > k)] + k
        lowered[at] = 0


def string_hashes(values: pa.Array) -> np.ndarray:
    """The hash of each string taken as one word (its bytes as they are)."""
    data, offsets = utf8_bytes(values)
    return span_hashes(data, offsets[:-1], offsets[1:])


_POWER_CACHE: dict[tuple[int, int], np.ndarray] = {}


def _powers(base: int, count: int) -> np.ndarray:
    """``base**0 .. base**(count-1)`` modulo 2**64 (numpy's integer products wrap), cached by
    the next power of two of ``count``."""
    size = 1 << max(count - 1, 1).bit_length()
    if (base, size) not in _POWER_CACHE:
        powers = np.full(size, base, np.uint64)
        powers[0] = 1
        _POWER_CACHE[(base, size)] = np.cumprod(powers, dtype=np.uint64)
    return _POWER_CACHE[(base, size)][:count]


def ngram_hashes(word_hashes: np.ndarray, text_of: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(hashes, starts)`` of every n-gram that lies inside one text: ``starts`` index its first
    word in ``word_hashes``. The hash of words ``w[i..i+n-1]`` is ``sum_j w[i+j] * B**(n-1-j)``
    (mod 2**64), read off one prefix sum of ``w[t] * B**-t``."""
    total = len(word_hashes)
    if total < n:
        return np.empty(0, np.uint64), np.empty(0, np.int64)
    count = total - n + 1
    with np.errstate(over="ignore"):
        prefix = np.zeros(total + 1, np.uint64)
        np.cumsum(word_hashes * _powers(WORD_BASE_INVERSE, total), out=prefix[1:])
        hashes = (prefix[n:] - prefix[:count]) * _powers(WORD_BASE, total)[n - 1 :]
    starts = np.flatnonzero(text_of[:count] == text_of[n - 1 :])
    return mix64(hashes[starts]), starts


def text_words(text: str) -> list[re.Match]:
    """One text's words with their character spans (Python's re, for cutting spans out)."""
    return list(PY_WORD.finditer(text))
