"""Bounded byte streams of a JSONL file: decompressed chunks (gzip and zstd by suffix) and the lines
they hold, a line longer than the limit drained without being held.

Both the partition planner (counting lines) and the JSONL reader use them.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from typing import Any

import zstandard

READ_CHUNK = 1 << 20
# Compressed input is fed in small pieces: one piece can expand about a thousandfold
# (deflate's limit is 1032:1), so this bounds what one step can put in memory.
COMPRESSED_CHUNK = 64 << 10


class TruncatedStream(EOFError):
    """A compressed stream ended inside a frame."""


def _decompressed_chunks(raw, new_decompressor: Callable[[], Any]) -> Iterator[bytes]:
    """Decompressed chunks of a gzip or zstd stream (several members/frames in a row are fine).

    Decompressor objects are used directly rather than ``gzip.open`` or zstandard's
    ``stream_reader``: the first drops the data decoded before a truncation when it raises,
    the second returns a clean end of file on a truncated frame. ``eof`` tells both cases apart.
    """
    decompressor, fed = new_decompressor(), False
    while data := raw.read(COMPRESSED_CHUNK):
        while data:
            fed = True
            out = decompressor.decompress(data)
            if out:
                yield out
            if not decompressor.eof:
                break
            data, decompressor, fed = decompressor.unused_data, new_decompressor(), False
    if fed and not decompressor.eof:
        raise TruncatedStream("the compressed stream ends inside a member or frame")


def _file_chunks(f, remaining: int = -1) -> Iterator[bytes]:
    while remaining != 0:
        chunk = f.read(READ_CHUNK if remaining < 0 else min(READ_CHUNK, remaining))
        if not chunk:
            return
        remaining -= len(chunk) if remaining > 0 else 0
        yield chunk


def open_jsonl(path: str, start: int = 0, end: int = -1) -> Iterator[bytes]:
    """Decompressed byte chunks of a JSONL file (.gz and .zst by suffix), from ``start`` to ``end``."""
    if path.endswith((".gz", ".zst", ".zstd")):
        gz = path.endswith(".gz")
        new_decompressor = (
            (lambda: zlib.decompressobj(16 + zlib.MAX_WBITS))
            if gz
            else zstandard.ZstdDecompressor().decompressobj
        )
        with open(path, "rb") as raw:
            yield from _decompressed_chunks(raw, new_decompressor)
    else:
        with open(path, "rb") as f:
            f.seek(start)
            yield from _file_chunks(f, -1 if end < 0 else end - start)


def iter_lines(chunks: Iterator[bytes], max_bytes: int, keep_bytes: int) -> Iterator[tuple[bytes, int]]:
    """``(line, size)`` without the newline; when ``size > max_bytes`` the bytes are only the
    first ``keep_bytes`` of the line, the rest was read and dropped."""
    parts: list[bytes] = []
    held, oversized = 0, False
    for chunk in chunks:
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            piece = chunk[start:] if newline < 0 else chunk[start:newline]
            held += len(piece)
            if not oversized:
                parts.append(piece)
                if held > max_bytes:
                    parts, oversized = [b"".join(parts)[:keep_bytes]], True
            if newline < 0:
                break
            yield b"".join(parts), held
            parts, held, oversized, start = [], 0, False, newline + 1
    if held:
        yield b"".join(parts), held
