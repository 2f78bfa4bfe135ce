"""Reading one partition into records: a document candidate (text to normalise) or a rejection
(reason, detail and a preview of what was read).

Every read is bounded: a file is read up to ``max_doc_bytes + 1`` bytes, a JSONL line longer
than ``max_doc_bytes`` is drained without being held, compressed streams are decompressed in
chunks. A failure to read (broken symlink, FIFO, permission, truncated or corrupt archive,
non-Parquet file) becomes a record, never an exception.
"""

from __future__ import annotations

import json
import os
import stat
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from tasks.ingest.normalize import decode_document, has_utf16_bom, preview
from tasks.ingest.streams import iter_lines, open_jsonl

if TYPE_CHECKING:
    from tasks.ingest.config import IngestConfig, SourceConfig
    from tasks.ingest.partitions import Partition

PARQUET_BATCH_ROWS = 1024


class Record(NamedTuple):
    locator: str
    text: str  # the document's text, or for a rejection what the quarantine keeps of it
    reason: str | None = None  # None: a candidate, still to be normalised and checked
    detail: str = ""
    source_id: str | None = None
    check_binary: bool = False  # strings from JSON or Parquet have not been through decode_document
    meta: dict[str, object] | None = None  # what the document's meta column adds (web pages: url, ...)


def _jsonl_record(line: bytes, locator: str, source: SourceConfig) -> Record:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as decode_error:
            return Record(
                locator, preview(line, 1000), "undecodable", f"invalid UTF-8 at byte {decode_error.start}"
            )
        try:
            json.loads(line)
        except ValueError:
            return Record(locator, preview(line, 1000), "malformed_jsonl", f"not JSON: {exc}")
        return Record(
            locator, preview(line, 1000), "undecodable", f"a string escapes a lone surrogate: {exc}"
        )
    if not isinstance(obj, dict):
        return Record(
            locator, preview(line, 1000), "malformed_jsonl", f"a JSON {type(obj).__name__}, not an object"
        )
    return _field_record(
        obj.get(source.text_field),
        obj.get(source.id_field) if source.id_field else None,
        locator,
        source,
        obj.get(source.url_field) if source.url_field else None,
    )


def _field_record(
    text: object, source_id: object, locator: str, source: SourceConfig, url: object = None
) -> Record:
    if text is None:
        return Record(locator, "", "missing_field", f"no value for text field {source.text_field!r}")
    if not isinstance(text, str):
        return Record(
            locator,
            str(text)[:1000],
            "wrong_field_type",
            f"text field {source.text_field!r} is {type(text).__name__}",
        )
    if source.id_field and source_id is None:
        return Record(locator, text, "missing_field", f"no value for id field {source.id_field!r}")
    return Record(
        locator,
        text,
        None,
        "",
        None if source_id is None else str(source_id),
        True,
        {"url": url} if isinstance(url, str) and url else None,  # what the blocklists match
    )


def read_jsonl(source: SourceConfig, partition: Partition, config: IngestConfig) -> Iterator[Record]:
    line_no = partition.first_line
    keep = config.quarantine_text_chars
    try:
        for line, size in iter_lines(
            open_jsonl(partition.path, partition.start, partition.end), config.max_doc_bytes, keep
        ):
            locator = f"{partition.rel}:{line_no}"
            line_no += 1
            if size > config.max_doc_bytes:
                yield Record(
                    locator,
                    preview(line, keep),
                    "too_long",
                    f"line of {size} bytes > max_doc_bytes {config.max_doc_bytes}",
                )
            elif line.strip():  # a blank line is not a record
                yield _jsonl_record(line, locator, source)
    except (EOFError, zlib.error, zstandard.ZstdError, OSError) as exc:
        truncated = isinstance(exc, EOFError)
        yield Record(
            f"{partition.rel}:{line_no}",
            "",
            "truncated_file" if truncated else "unreadable_file",
            f"{'stream truncated' if truncated else 'read failed'} at line {line_no}: {exc}",
        )


def read_files(source: SourceConfig, partition: Partition, config: IngestConfig) -> Iterator[Record]:
    keep = config.quarantine_text_chars
    for path, rel in partition.files:
        try:
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode):
                yield Record(
                    rel, "", "unreadable_file", f"not a regular file (mode {stat.filemode(st.st_mode)})"
                )
                continue
            with open(path, "rb") as f:
                data = f.read(config.max_doc_bytes + 1)
        except OSError as exc:
            yield Record(rel, "", "unreadable_file", f"{type(exc).__name__}: {exc.strerror or exc}")
            continue
        if len(data) > config.max_doc_bytes:
            yield Record(
                rel,
                preview(data, keep),
                "too_long",
                f"{st.st_size} bytes > max_doc_bytes {config.max_doc_bytes}",
            )
            continue
        text, reason, detail = decode_document(data, config.binary_control_fraction)
        yield (
            Record(rel, text, None, check_binary=has_utf16_bom(data))
            if reason is None
            else Record(rel, preview(data, min(keep, 1000)), reason, detail)
        )


def parquet_schema_problem(schema: pa.Schema, source: SourceConfig) -> str | None:
    """Why a Parquet file's schema cannot give this source's documents, or None."""
    for field_name in filter(None, (source.text_field, source.id_field)):
        if field_name not in schema.names:
            return f"no column {field_name!r} (columns: {', '.join(schema.names)})"
    text_type = schema.field(source.text_field).type
    if pa.types.is_dictionary(text_type):
        text_type = text_type.value_type
    if not (
        pa.types.is_string(text_type)
        or pa.types.is_large_string(text_type)
        or pa.types.is_string_view(text_type)
    ):
        return f"column {source.text_field!r} is {text_type}, expected a string"
    return None


def read_parquet(source: SourceConfig, partition: Partition, config: IngestConfig) -> Iterator[Record]:
    # A whole-file failure is one record, from the file's first partition only (so it is not
    # counted once per partition); its row count is in the detail.
    whole_file = partition.start == 0
    try:
        pf = pq.ParquetFile(partition.path)
    except Exception as exc:  # noqa: BLE001 - any failure to open is this file's quarantine reason
        if whole_file:
            yield Record(partition.rel, "", "unreadable_file", f"not a readable Parquet file: {exc}")
        return
    problem = parquet_schema_problem(pf.schema_arrow, source)
    if problem:
        if whole_file:
            yield Record(partition.rel, "", "wrong_parquet_schema", f"{problem}; {pf.metadata.num_rows} rows")
        return
    end = pf.num_row_groups if partition.end < 0 else partition.end
    columns = [c for c in (source.text_field, source.id_field) if c]
    url_column = source.url_field if source.url_field in pf.schema_arrow.names else None
    columns += [url_column] if url_column and url_column not in columns else []
    row = partition.first_line
    try:
        for batch in pf.iter_batches(
            PARQUET_BATCH_ROWS, row_groups=range(partition.start, end), columns=columns
        ):
            texts = batch.column(source.text_field).to_pylist()
            ids = batch.column(source.id_field).to_pylist() if source.id_field else [None] * len(texts)
            urls = batch.column(url_column).to_pylist() if url_column else [None] * len(texts)
            for text, source_id, url in zip(texts, ids, urls, strict=True):
                yield _field_record(text, source_id, f"{partition.rel}:{row}", source, url)
                row += 1
    except Exception as exc:  # noqa: BLE001 - a corrupt row group: the rest of the partition is one record
        yield Record(f"{partition.rel}:{row}", "", "unreadable_file", f"read failed at row {row}: {exc}")


READERS = {"files": read_files, "jsonl": read_jsonl, "parquet": read_parquet}
