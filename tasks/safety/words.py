"""Words and word n-grams as 64-bit hashes, over a whole batch at once.

A word is a maximal run of letters and digits after lower-casing (``str.isalnum``, what
Python's ``[^\\W_]`` matches), so case, whitespace and punctuation do not change a document's
n-grams.

The batch's UTF-8 bytes are one NumPy array, with their bitmaps
(:mod:`tasks.safety.bitmaps`). The words of an ASCII text (most of a corpus) are its runs of
ASCII letters and digits, read off the word bitmap and hashed straight from the bytes (setting
bit 5 lower-cases a letter and keeps a digit). In a text with a non-ASCII byte, a run of
letters, digits and non-ASCII bytes that holds one is lower-cased by a table per code point
made from Arrow's ``utf8_lower`` (its characters that are no letter or digit, by
``str.isalnum``, split it). Word edges, word hashes, n-gram hashes and set membership are one
compiled pass per text (:mod:`tasks.safety.scan`). The hashes are stable across processes and
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

from tasks.safety import scan
from tasks.safety.bitmaps import Bitmaps, any_high, bitmaps
from tasks.text_bytes import span_hashes, utf8_bytes

PY_WORD = re.compile(r"[^\W_]+")  # the same words for Python's re: letters and digits

_WORD_BYTE = np.zeros(256, bool)
for _first, _last in (("0", "9"), ("a", "z"), ("A", "Z")):
    _WORD_BYTE[ord(_first) : ord(_last) + 1] = True
_WORD_BYTE[0x80:] = True  # non-ASCII bytes are left only inside words (see the module docstring)
LOWER_WORD = np.where(_WORD_BYTE, np.arange(256), 0).astype(np.uint8)  # a word byte lower-cased, else 0
LOWER_WORD[ord("A") : ord("Z") + 1] += 32


@dataclass(frozen=True)
class BatchBytes:
    """A batch's bytes as the compiled passes read them: ``data[offsets[i]:offsets[i+1]]`` is
    text ``i``; ``view`` the same bytes as overlapping little-endian uint64s (``view[i]`` is
    ``data[i:i+8]``); ``maps`` their bitmaps; ``ascii`` per text whether all its bytes are
    ASCII; ``lower`` the code-point table (:func:`lower_code_points`; one entry when every text
    is ASCII: it is never read then)."""

    data: np.ndarray
    offsets: np.ndarray
    view: np.ndarray
    maps: Bitmaps
    ascii: np.ndarray
    lower: np.ndarray

    def spell(self, text: int, first: int, count: int) -> str:
        """Words ``first .. first + count - 1`` of ``text``, lower-cased, joined by spaces."""
        lowered, starts, ends = scan.text_words(
            self.data, self.offsets[text], self.offsets[text + 1], LOWER_WORD, self.lower
        )
        spans = zip(starts[first : first + count].tolist(), ends[first : first + count].tolist(), strict=True)
        return " ".join(lowered[a:b].tobytes().decode("utf-8", "replace") for a, b in spans)


def batch_bytes(texts: pa.Array) -> BatchBytes:
    """The bytes of every text (a null text is empty)."""
    data, offsets = utf8_bytes(texts)
    if len(data) < 8:  # the view needs eight bytes
        data = np.concatenate([data, np.zeros(8 - len(data), np.uint8)])
        data.flags.writeable = False  # as Arrow's buffers are: one signature for numba to compile
    maps = bitmaps(data)
    ascii_ = ~any_high(maps, offsets)
    view = np.ndarray(shape=(len(data) - 7,), dtype="<u8", buffer=data, strides=(1,))
    return BatchBytes(data, offsets, view, maps, ascii_, _ASCII_ONLY if ascii_.all() else lower_code_points())


_ASCII_ONLY = np.full(1, -1, np.int32)


@functools.cache
def lower_code_points() -> np.ndarray:
    """Per code point: its lower case (Arrow's ``utf8_lower``, one code point for one) when
    that is a letter or digit (``str.isalnum``, what ``PY_WORD`` matches), else -1."""
    points = np.arange(0x110000, dtype=np.int64)
    valid = points[(points < 0xD800) | (points > 0xDFFF)]  # no surrogates in UTF-8
    every = valid.astype("<u4").tobytes().decode("utf-32-le")
    lowered = pc.utf8_lower(pa.array([every], pa.large_string()))[0].as_py()
    low = np.frombuffer(lowered.encode("utf-32-le"), "<u4").astype(np.int64)
    alnum = np.fromiter((chr(c).isalnum() for c in range(0x110000)), bool, 0x110000)
    table = np.full(0x110000, -1, np.int32)
    table[valid] = np.where(alnum[low], low, -1)
    return table


def string_hashes(values: pa.Array) -> np.ndarray:
    """The hash of each string taken as one word (its bytes as they are)."""
    data, offsets = utf8_bytes(values)
    return span_hashes(data, offsets[:-1], offsets[1:])


def text_words(text: str) -> list[re.Match]:
    """One text's words with their character spans (Python's re, for cutting spans out)."""
    return list(PY_WORD.finditer(text))
