"""A batch of Arrow strings as one NumPy byte array, and 64-bit hashes of byte spans of it.

Shared by the dedup shingles and the safety stage's word n-grams, so that neither calls into
Python once per word: a span's hash is read 8 bytes at a time through an overlapping
``uint64`` view of the bytes (zero-masked past the span's end, mixed with its length, so
spans of up to 8 bytes never collide) and finalised with splitmix64.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_UINT64_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], np.uint64)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection of uint64 that spreads every input bit."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def one_array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A column as one array: its only chunk as it is (``combine_chunks`` would copy it)."""
    if isinstance(column, pa.Array):
        return column
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def large_strings(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One contiguous ``large_string`` array without nulls (a null text is the empty text)."""
    texts = one_array(texts)
    if texts.type != pa.large_string():
        texts = texts.cast(pa.large_string())
    return texts.fill_null("") if texts.null_count else texts


def utf8_bytes(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(all bytes as uint8, int64 offsets of each document), zero-copy where Arrow allows; nulls are ''."""
    texts = large_strings(texts)
    _, offsets_buffer, data_buffer = texts.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int64, len(texts) + 1, texts.offset * 8)
    start, stop = int(offsets[0]), int(offsets[-1])
    data = (
        np.frombuffer(data_buffer, np.uint8, stop - start, start) if stop > start else np.zeros(0, np.uint8)
    )
    return data, offsets - start


def runs(mask: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, document of each run) of the maximal runs of True bytes in ``mask``, in
    order; a run never crosses from one document (``offsets``) into the next."""
    edges = np.empty(len(mask) + 1, bool)  # edges[i]: mask changes between bytes i - 1 and i
    edges[0], edges[-1] = (mask[0], mask[-1]) if len(mask) else (False, False)
    np.not_equal(mask[1:], mask[:-1], out=edges[1:-1])
    boundaries = np.flatnonzero(edges)  # runs and gaps alternate: start, end, start, end, ...
    starts, ends = boundaries[0::2], boundaries[1::2]
    inner = np.unique(offsets[1:-1])
    inner = inner[(inner > 0) & (inner < len(mask))]
    glued = inner[mask[inner] & mask[inner - 1]]
    if glued.size:
        starts = np.insert(starts, np.searchsorted(starts, glued), glued)
        ends = np.insert(ends, np.searchsorted(ends, glued), glued)
    first = np.searchsorted(
        starts, offsets
    )  # runs before each document's start (few searches, not one per run)
    doc = np.repeat(np.arange(len(offsets) - 1), np.diff(first))
    return starts, ends, doc


def span_hashes(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each span's bytes ``data[start:end]``."""
    padded = np.zeros(len(data) + 8, np.uint8)
    padded[: len(data)] = data
    eight_bytes_at = np.ndarray(shape=(len(data) + 1,), dtype="<u8", buffer=padded, strides=(1,))
    lengths = ends - starts
    hashes = mix64(
        (eight_bytes_at[starts] & _UINT64_MASKS[np.minimum(lengths, 8)])
        ^ (lengths.astype(np.uint64) * GOLDEN)
    )
    longer = np.flatnonzero(lengths > 8)
    chunk = 1
    while longer.size:
        remaining = lengths[longer] - 8 * chunk
        piece = eight_bytes_at[starts[longer] + 8 * chunk] & _UINT64_MASKS[np.minimum(remaining, 8)]
        hashes[longer] = mix64(hashes[longer] ^ piece)
        longer = longer[remaining > 8]
        chunk += 1
    return hashes
