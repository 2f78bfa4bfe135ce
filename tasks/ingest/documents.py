"""One partition in, two Arrow tables out: the documents kept and the ones quarantined.

Records from a reader are normalised and checked in batches (pyarrow compute), so the
per-document Python work is only reading, decoding and building ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import islice

import pyarrow as pa
import pyarrow.compute as pc

from tasks.ingest.config import IngestConfig, SourceConfig
from tasks.ingest.normalize import binary_text_mask, normalize_texts
from tasks.ingest.partitions import Partition
from tasks.ingest.readers import READERS, Record
from tasks.ingest.warc import read_html, read_warc
from tasks.schema import DOCUMENT_SCHEMA, document_id, with_quarantine_reason

STAGE = "ingest"
BATCH_RECORDS = 512
QUARANTINE_SCHEMA = pa.schema(
    [
        *DOCUMENT_SCHEMA,
        pa.field("stage", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("detail", pa.string()),
    ]
)


def _meta(source: SourceConfig, record: Record | None = None) -> str:
    extra: dict[str, object] = {}
    if record is not None:
        extra = {
            **(record.meta or {}),
            **({} if record.source_id is None else {"source_id": record.source_id}),
        }
    return json.dumps({"kind": source.kind, "format": source.format, **extra}, ensure_ascii=False)


def _documents(
    source: SourceConfig, locators: list[str], texts: pa.Array, metas: list[str], ids: list[str]
) -> pa.Table:
    return pa.table(
        [
            pa.array(ids, pa.string()),
            pa.array([source.name] * len(ids), pa.string()),
            texts,
            pa.array(locators, pa.string()),
            pa.array(metas, pa.string()),
        ],
        schema=DOCUMENT_SCHEMA,
    )


def _refusal(
    source: SourceConfig, record: Record, too_big: bool, binary: bool, blank: bool, chars: int
) -> str | None:
    """Why a decoded, normalised candidate is not kept, or None."""
    if too_big:
        return "too_long"
    if record.check_binary and binary:
        return "binary"
    if blank:
        return "empty"
    if chars < source.min_chars:
        return "too_short"
    if chars > source.max_chars:
        return "too_long"
    return None


def _finish_batch(
    source: SourceConfig, records: list[Record], config: IngestConfig
) -> tuple[pa.Table, pa.Table]:
    """Normalise the candidates of a batch, check them, and build both tables."""
    keep_chars = config.quarantine_text_chars
    rejected = [(r, r.text[:keep_chars]) for r in records if r.reason is not None]
    candidates = [r for r in records if r.reason is None]
    raw = pa.array([r.text for r in candidates], pa.string())
    too_big = pc.greater(pc.binary_length(raw), config.max_doc_bytes).to_pylist()
    binary = binary_text_mask(raw, config.binary_control_fraction).to_pylist()
    texts = normalize_texts(raw)
    chars = pc.utf8_length(texts).to_pylist()
    blank = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(texts)), 0).to_pylist()
    keep = []
    for i, record in enumerate(candidates):
        reason = _refusal(source, record, too_big[i], binary[i], blank[i], chars[i])
        keep.append(reason is None)
        if reason is not None:
            detail = _refusal_detail(source, config, reason, chars[i], len(record.text.encode()))
            rejected.append((record._replace(reason=reason, detail=detail), texts[i].as_py()[:keep_chars]))
    good = [r for r, k in zip(candidates, keep, strict=True) if k]
    kept = _documents(
        source,
        [r.locator for r in good],
        pc.filter(texts, pa.array(keep, pa.bool_())),
        [_meta(source, r) for r in good],
        [document_id(source.name, r.locator if r.source_id is None else r.source_id) for r in good],
    )
    quarantined = _documents(
        source,
        [r.locator for r, _ in rejected],
        pa.array([text for _, text in rejected], pa.string()),
        [_meta(source, r) for r, _ in rejected],
        [document_id(source.name, r.locator) for r, _ in rejected],
    )
    return kept, _with_reason_and_detail(
        quarantined, [r.reason for r, _ in rejected], [r.detail for r, _ in rejected]
    )


def _with_reason_and_detail(table: pa.Table, reasons: list[str], details: list[str]) -> pa.Table:
    """The quarantine columns: ``stage``, ``reason`` and what exactly (limit, byte offset, field)."""
    return with_quarantine_reason(table, STAGE, reasons).append_column(
        "detail", pa.array(details, pa.string())
    )


def _refusal_detail(source: SourceConfig, config: IngestConfig, reason: str, chars: int, size: int) -> str:
    if reason == "binary":
        return f"more than binary_control_fraction {config.binary_control_fraction:g} of the text is control characters"
    if reason == "too_long" and size > config.max_doc_bytes:
        return f"{size} bytes > max_doc_bytes {config.max_doc_bytes}"
    if reason == "too_long":
        return f"{chars} characters after normalisation > max_chars {source.max_chars}"
    if reason == "too_short":
        return f"{chars} characters after normalisation < min_chars {source.min_chars}"
    return "only whitespace after normalisation"


def iter_partition(
    source: SourceConfig, partition: Partition, config: IngestConfig
) -> Iterator[tuple[pa.Table, pa.Table]]:
    """``(kept, quarantined)`` per batch of records of one partition."""
    records = {**READERS, "warc": read_warc, "html": read_html}[source.format](source, partition, config)
    while batch := list(islice(records, BATCH_RECORDS)):
        yield _finish_batch(source, batch, config)


def ingest_partition(
    source: SourceConfig, partition: Partition, config: IngestConfig
) -> tuple[pa.Table, pa.Table]:
    """The documents of one partition: ``(kept, quarantined)`` with the DESIGN.md schema
    (quarantine adds ``stage`` and ``reason``). A pure function of the input files."""
    kept, quarantined = [], []
    for k, q in iter_partition(source, partition, config):
        kept.append(k)
        quarantined.append(q)
    empty = _documents(source, [], pa.array([], pa.string()), [], [])
    return (
        pa.concat_tables([empty, *kept]),
        pa.concat_tables([_with_reason_and_detail(empty, [], []), *quarantined]),
    )
