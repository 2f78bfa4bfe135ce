"""Where a WARC file can be cut into partitions: record boundaries, read from the record headers.

Kept apart from the WARC reader so that the partition planner never imports the readers.
"""

from __future__ import annotations

import os
import zlib

from fastwarc.warc import ArchiveIterator

GZIP_MEMBER_MAGIC = b"\x1f\x8b\x08"


def is_gzip(path: str) -> bool:
    return path.endswith(".gz")


def _gzip_member_starts_at(f, offset: int) -> bool:
    """Whether a gzip member holding a WARC record starts at ``offset``."""
    f.seek(offset)
    head = f.read(4096)
    if not head.startswith(GZIP_MEMBER_MAGIC):
        return False
    try:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 16).startswith(b"WARC/")
    except zlib.error:
        return False


def record_boundaries(path: str) -> list[tuple[int, int]]:
    """``(offset, record number)`` where a partition of this WARC file may start: every record of a
    plain file; in a ``.warc.gz``, records that begin a gzip member of their own (a file compressed
    as one stream, or members of several records, cannot be cut inside). Starts with ``(0, 1)``."""
    positions = [record.stream_pos for record in ArchiveIterator(path, parse_http=False)]
    numbered = [(p, n) for n, p in enumerate(positions, 1) if p > 0]
    if not is_gzip(path):
        return [(0, 1), *numbered]
    # fastwarc reports a record inside a multi-record member at the next member's offset, so a
    # position shared by two records is not a boundary; the others are checked on disk
    counts: dict[int, int] = {}
    for p in positions:
        counts[p] = counts.get(p, 0) + 1
    with open(path, "rb") as f:
        return [(0, 1), *((p, n) for p, n in numbered if counts[p] == 1 and _gzip_member_starts_at(f, p))]


def warc_ranges(path: str, partition_bytes: int) -> list[tuple[int, int, int]]:
    """``(start, end, first record number)`` byte ranges of about ``partition_bytes``, each
    starting at a record boundary."""
    if os.stat(path).st_size <= partition_bytes:
        return [(0, -1, 1)]
    ranges, start, first = [], 0, 1
    for boundary, number in record_boundaries(path):
        if boundary - start >= partition_bytes:
            ranges.append((start, boundary, first))
            start, first = boundary, number
    ranges.append((start, -1, first))
    return ranges
