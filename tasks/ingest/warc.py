"""WARC files (``.warc``, ``.warc.gz``) and HTML files into page records, and WARC partitions cut at
record boundaries.

Reading is fastwarc's ``ArchiveIterator`` (headers only; the block is read here, bounded, so that a
truncated record is told from a whole one by its ``Content-Length``). ``response`` and ``resource``
records are pages; ``request``, ``metadata``, ``warcinfo`` and ``revisit`` records describe a capture
and hold no page of their own, so they are not documents.

A WARC record's locator is ``path:offset``, the byte offset of the record in the file (of its gzip
member in a ``.warc.gz``), as Common Crawl's indexes give it.
"""

from __future__ import annotations

import io
import os
import stat
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from fastwarc.stream_io import ChunkedReader
from fastwarc.warc import ArchiveIterator, HeaderMap, WarcRecordType

from tasks.ingest.pages import charset_of_content_type, media_type, page_record
from tasks.ingest.readers import Record

if TYPE_CHECKING:
    from tasks.ingest.config import IngestConfig, SourceConfig
    from tasks.ingest.partitions import Partition

PAGE_RECORDS = WarcRecordType.response | WarcRecordType.resource
HTTP_HEADER_SLACK = 64 << 10  # a block may exceed max_doc_bytes by its HTTP headers
DECODABLE = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def _http_payload(block: bytes, max_bytes: int) -> tuple[HeaderMap, bytes, str | None, str]:
    """``(HTTP headers, decoded body, reason, detail)`` of a response block; reason None when readable."""
    headers = HeaderMap()
    try:
        consumed = headers.parse(io.BytesIO(block), True)
    except OSError as exc:
        return headers, b"", "malformed_warc", f"HTTP headers unreadable: {exc}"
    body = block[consumed:]
    if "chunked" in (headers.get("Transfer-Encoding") or "").lower():
        try:
            body = ChunkedReader(io.BytesIO(body)).read()
        except OSError as exc:
            return headers, b"", "truncated_record", f"chunked body broken off: {exc}"
    encoding = (headers.get("Content-Encoding") or "identity").strip().lower()
    if encoding not in ("identity", ""):
        if encoding not in DECODABLE:
            return headers, b"", "not_html", f"Content-Encoding {encoding} is not decoded"
        try:
            decompressor = zlib.decompressobj(DECODABLE[encoding])
            body = decompressor.decompress(body, max_bytes + 1)
        except zlib.error as exc:
            return headers, b"", "truncated_record", f"{encoding} body unreadable: {exc}"
        if len(body) > max_bytes:
            return headers, b"", "oversized_page", f"decoded body > max_doc_bytes {max_bytes}"
    return headers, body, None, ""


def _page(record, locator: str, config: IngestConfig) -> Record:
    """One ``response`` or ``resource`` record into a page record."""
    warc = record.headers
    meta: dict[str, object] = {
        "url": warc.get("WARC-Target-URI"),
        "warc_record_id": record.record_id,
        "date": warc.get("WARC-Date"),
        "warc_offset": record.stream_pos,
    }
    declared = int(warc.get("Content-Length") or 0)
    limit = config.max_doc_bytes + HTTP_HEADER_SLACK
    if declared > limit:
        return Record(
            locator,
            "",
            "oversized_page",
            f"record of {declared} bytes > max_doc_bytes {config.max_doc_bytes}",
            meta=meta,
        )
    if warc.get("WARC-Truncated"):
        return Record(
            locator,
            "",
            "truncated_record",
            f"the crawler truncated it (WARC-Truncated: {warc.get('WARC-Truncated')})",
            meta=meta,
        )
    block = record.reader.read(declared)
    if len(block) < declared:
        return Record(
            locator,
            "",
            "truncated_record",
            f"{len(block)} of {declared} bytes before the file ends",
            meta=meta,
        )
    if (
        record.record_type == WarcRecordType.response
        and media_type(warc.get("Content-Type")) == "application/http"
    ):
        http, body, reason, detail = _http_payload(block, config.max_doc_bytes)
        if reason is not None:
            return Record(locator, "", reason, detail, meta=meta)
        status = http.status_code
        if status is None or not 200 <= status < 300:
            return Record(locator, "", "http_status", f"HTTP status {status}: {http.status_line}", meta=meta)
        content_type = http.get("Content-Type")
    else:
        body, content_type = block, warc.get("Content-Type")
    if len(body) > config.max_doc_bytes:
        return Record(
            locator,
            "",
            "oversized_page",
            f"payload of {len(body)} bytes > max_doc_bytes {config.max_doc_bytes}",
            meta=meta,
        )
    return page_record(
        body,
        locator,
        media_type(content_type),
        charset_of_content_type(content_type),
        meta,
        config.quarantine_text_chars,
    )


def _records(path: str, start: int, end: int) -> Iterator:
    """The records of ``path`` that start in ``[start, end)`` (``end`` -1: to the end of the file)."""
    if start == 0 and end < 0:
        yield from ArchiveIterator(path, parse_http=False)
        return
    with open(path, "rb") as f:
        f.seek(start)
        for record in ArchiveIterator(f, parse_http=False):
            if 0 <= end <= record.stream_pos:
                return
            yield record


def read_warc(source: SourceConfig, partition: Partition, config: IngestConfig) -> Iterator[Record]:
    """The pages of the records starting in the partition's byte range; a locator is ``path:N``,
    N counting the file's records (of every type) from 1."""
    number, position = partition.first_line, partition.start
    try:
        if not stat.S_ISREG(os.stat(partition.path).st_mode):
            yield Record(partition.rel, "", "unreadable_file", "not a regular file")
            return
        for record in _records(partition.path, partition.start, partition.end):
            position = record.stream_pos
            if record.record_type & PAGE_RECORDS:
                yield _page(record, f"{partition.rel}:{number}", config)
            number += 1
    except OSError as exc:
        yield Record(
            f"{partition.rel}:{number}",
            "",
            "malformed_warc",
            f"record {number} (near byte {position}) is not readable as WARC: {exc}; "
            "the rest of the partition is this record",
        )


def read_html(source: SourceConfig, partition: Partition, config: IngestConfig) -> Iterator[Record]:
    """One page per file; its URL is its ``<link rel=canonical>``, if it has one."""
    for path, rel in partition.files:
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                yield Record(rel, "", "unreadable_file", "not a regular file")
                continue
            with open(path, "rb") as f:
                data = f.read(config.max_doc_bytes + 1)
        except OSError as exc:
            yield Record(rel, "", "unreadable_file", f"{type(exc).__name__}: {exc.strerror or exc}")
            continue
        if len(data) > config.max_doc_bytes:
            yield Record(rel, "", "oversized_page", f"more than max_doc_bytes {config.max_doc_bytes} bytes")
            continue
        yield page_record(data, rel, "text/html", None, {}, config.quarantine_text_chars, find_canonical=True)
