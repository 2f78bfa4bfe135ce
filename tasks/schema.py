"""The document schema every stage reads and writes (DESIGN.md section 4), document ids, and the
columns a quarantined document gains."""

from __future__ import annotations

import hashlib

import pyarrow as pa

DOCUMENT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("text", pa.string()),
        ("locator", pa.string()),
        ("meta", pa.string()),
    ]
)
QUARANTINE_COLUMNS = [("stage", pa.string()), ("reason", pa.string())]


def document_id(source: str, locator: str) -> str:
    """Stable id: sha256 of source and locator."""
    return hashlib.sha256(f"{source}\0{locator}".encode()).hexdigest()


def with_quarantine_reason(table: pa.Table, stage: str, reasons: pa.Array | list[str]) -> pa.Table:
    """Add ``stage`` and ``reason`` columns to rejected rows (every input column kept)."""
    n = table.num_rows
    table = table.append_column("stage", pa.array([stage] * n, pa.string()))
    return table.append_column("reason", pa.array(reasons, pa.string()))
