"""Listing a source and splitting it into partitions: independent units of work that can run
in parallel and be retried alone.

* ``files``: consecutive files (in path order) up to ``partition_bytes`` or ``max_files_per_partition``.
* ``jsonl``: a plain file is split into byte ranges at line boundaries; planning reads it once
  to count lines, so every partition knows the line number it starts at (locators are
  ``path:line``). A compressed file (.gz, .zst) cannot be split and is one partition.
* ``parquet``: consecutive row groups of one file up to ``partition_bytes`` (uncompressed).
* ``warc``: a file up to ``partition_bytes`` is one partition; a larger one is split into byte
  ranges that start at record boundaries (planning reads its headers once): any record of a plain
  ``.warc``, a record that begins its own gzip member in a ``.warc.gz`` (a file gzipped as one
  stream is one partition). ``html``: grouped as ``files`` are.

Before any partition runs, :func:`check_source` fails fast on a missing path, a source
that matches no file, or a text/id field that none of the probed records have.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pyarrow.parquet as pq

from tasks.ingest.config import IngestConfig, SourceConfig
from tasks.ingest.streams import iter_lines, open_jsonl
from tasks.ingest.warc_boundaries import warc_ranges
from tasks.stage import ConfigError

SCAN_CHUNK = 8 << 20
PROBE_RECORDS = 100
PROBE_FILES = 5


@dataclass(frozen=True)
class Partition:
    """One unit of ingest work. ``files`` holds ``(absolute path, locator path)`` pairs."""

    source: str
    index: int
    files: tuple[tuple[str, str], ...]
    start: int = 0  # jsonl, warc: first byte; parquet: first row group
    end: int = -1  # jsonl, warc: end byte (exclusive, -1 = to the end); parquet: end row group
    first_line: int = 1  # jsonl: line number of the first byte; parquet: row number of the first row;
    # warc: number of the first record (from 1)

    @property
    def path(self) -> str:
        return self.files[0][0]

    @property
    def rel(self) -> str:
        return self.files[0][1]


def _glob_regex(patterns: list[str]) -> re.Pattern[str]:
    """One compiled regex for a list of fnmatch patterns (matching never succeeds for an empty list)."""
    return re.compile("|".join(fnmatch.translate(p) for p in patterns) or "(?!)")


def list_source_files(source: SourceConfig) -> list[tuple[str, str]]:
    """Every non-directory entry under the source path that the globs select, in path order.

    Broken symlinks, FIFOs and the like are listed on purpose: reading them fails, and the
    failure is quarantined as ``unreadable_file`` rather than skipped silently.
    """
    root = Path(source.path).expanduser()
    if not os.path.lexists(root):
        raise ConfigError(f"source {source.name!r}: path {str(root)!r} does not exist; fix its 'path'")
    if not root.is_dir():
        return [(str(root.resolve()), root.name)]
    include, exclude = _glob_regex(source.include), _glob_regex(source.exclude)
    # a folder that a "<folder>/*" exclude pattern matches holds only excluded files: skip it unread
    excluded_folder = _glob_regex([p for p in source.exclude if p.endswith("/*")])
    selected = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
        base = "" if rel_dir == "." else f"{rel_dir}/"
        dirnames[:] = sorted(d for d in dirnames if not excluded_folder.match(f"{base}{d}/"))
        for name in filenames:
            rel = base + name
            if include.match(rel) and not exclude.match(rel):
                selected.append((os.path.join(dirpath, name), rel))
    return sorted(selected, key=lambda pair: pair[1])


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _plan_files(files: list[tuple[str, str]], config: IngestConfig) -> Iterator[tuple]:
    group: list[tuple[str, str]] = []
    group_bytes = 0
    for pair in files:
        size = min(_size(pair[0]), config.max_doc_bytes)
        if group and (
            group_bytes + size > config.partition_bytes or len(group) >= config.max_files_per_partition
        ):
            yield tuple(group), 0, -1, 1
            group, group_bytes = [], 0
        group.append(pair)
        group_bytes += size
    if group:
        yield tuple(group), 0, -1, 1


def _jsonl_ranges(path: str, partition_bytes: int) -> Iterator[tuple[int, int, int]]:
    """``(start, end, first_line)`` byte ranges of a plain JSONL file, each ending after a newline."""
    size = _size(path)
    if size <= partition_bytes:
        yield 0, -1, 1
        return
    start, start_line = 0, 1
    pos, newlines = 0, 0  # absolute offset of the chunk; newlines before it
    target = partition_bytes
    with open(path, "rb") as f:
        while chunk := f.read(SCAN_CHUNK):
            counted = 0  # newlines of chunk[:counted] are in `newlines`
            while (search_from := max(target - 1 - pos, counted)) < len(chunk):
                newline = chunk.find(b"\n", search_from)
                if newline < 0:
                    break
                newlines += chunk.count(b"\n", counted, newline + 1)
                counted = newline + 1
                yield start, pos + counted, start_line
                start, start_line = pos + counted, newlines + 1
                target = start + partition_bytes
            newlines += chunk.count(b"\n", counted)
            pos += len(chunk)
    if start < size:
        yield start, -1, start_line


def _plan_jsonl(files: list[tuple[str, str]], config: IngestConfig) -> Iterator[tuple]:
    for pair in files:
        if pair[0].endswith((".gz", ".zst", ".zstd")) or not os.path.isfile(pair[0]):
            yield (pair,), 0, -1, 1
            continue
        try:
            yield from (((pair,), *r) for r in _jsonl_ranges(pair[0], config.partition_bytes))
        except OSError:
            yield (pair,), 0, -1, 1


def _plan_warc(files: list[tuple[str, str]], config: IngestConfig) -> Iterator[tuple]:
    for pair in files:
        try:
            ranges = warc_ranges(pair[0], config.partition_bytes) if os.path.isfile(pair[0]) else [(0, -1, 1)]
        except OSError:  # not readable as WARC: the reader quarantines it
            ranges = [(0, -1, 1)]
        yield from (((pair,), *r) for r in ranges)


def _plan_parquet(files: list[tuple[str, str]], config: IngestConfig) -> Iterator[tuple]:
    for pair in files:
        try:
            meta = pq.read_metadata(pair[0])
        except Exception:  # an unreadable or non-Parquet file is quarantined by the reader
            yield (pair,), 0, -1, 0
            continue
        if meta.num_row_groups == 0:
            yield (pair,), 0, 0, 0
            continue
        first, first_row, group_bytes, row = 0, 0, 0, 0
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            if g > first and group_bytes + rg.total_byte_size > config.partition_bytes:
                yield (pair,), first, g, first_row
                first, first_row, group_bytes = g, row, 0
            group_bytes += rg.total_byte_size
            row += rg.num_rows
        yield (pair,), first, meta.num_row_groups, first_row


def _probe_jsonl(path: str) -> list[dict] | None:
    """Up to PROBE_RECORDS parsed objects from the start of a JSONL file; None if unreadable."""
    objects: list[dict] = []
    try:
        for line, size in iter_lines(open_jsonl(path), 1 << 20, 0):
            if size <= 1 << 20 and line.strip():
                try:
                    obj = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(obj, dict):
                    objects.append(obj)
            if len(objects) >= PROBE_RECORDS:
                break
    except Exception:  # noqa: BLE001 - a broken file is quarantined later, not a config error
        return None
    return objects


def _check_fields(source: SourceConfig, files: list[tuple[str, str]]) -> None:
    """Fail when the configured fields are in none of the probed records or schemas (the
    first PROBE_RECORDS records of up to PROBE_FILES readable files).

    A field missing from some records is data (quarantined as missing_field or
    wrong_parquet_schema); missing from every one probed, it is a typo in the config.
    """
    fields = [f for f in (source.text_field, source.id_field) if f]
    seen: set[str] = set()
    probed = 0
    for path, _ in files:
        if source.format == "parquet":
            try:
                names = pq.read_schema(path).names
            except Exception:  # noqa: BLE001 - an unreadable file is quarantined later
                continue
            if all(f in names for f in fields):
                return
            seen.update(names)
        else:
            objects = _probe_jsonl(path)
            if not objects:
                continue
            if any(all(f in obj for f in fields) for obj in objects):
                return
            seen.update(k for obj in objects for k in obj)
        probed += 1
        if probed >= PROBE_FILES:  # probing every file would read a large source twice
            break
    if seen:
        missing = [f for f in fields if f not in seen] or fields
        where = "column" if source.format == "parquet" else "key"
        raise ConfigError(
            f"source {source.name!r}: no record has the {where} {missing[0]!r}; set text_field/id_field "
            f"to one of: {', '.join(sorted(seen)[:20])}"
        )


def check_source(source: SourceConfig) -> list[tuple[str, str]]:
    """The source's files, after failing fast on what a person must fix in the config."""
    files = list_source_files(source)
    if not files:
        raise ConfigError(
            f"source {source.name!r}: no file under {source.path!r} matches include {source.include} "
            f"and not exclude {source.exclude}; fix its globs or path"
        )
    if source.format in ("jsonl", "parquet"):
        _check_fields(source, files)
    return files


def plan_partitions(
    source: SourceConfig, config: IngestConfig, files: list[tuple[str, str]] | None = None
) -> list[Partition]:
    """The partitions of one source, in a deterministic order."""
    files = check_source(source) if files is None else files
    planner = {
        "files": _plan_files,
        "html": _plan_files,
        "jsonl": _plan_jsonl,
        "parquet": _plan_parquet,
        "warc": _plan_warc,
    }[source.format]
    return [
        Partition(source.name, i, group, start, end, first)
        for i, (group, start, end, first) in enumerate(planner(files, config))
    ]


def describe(partition: Partition) -> str:
    """``partition 3 of source 'web' (a.jsonl [0:1048576])``: where a failure happened."""
    where = (
        partition.rel if len(partition.files) == 1 else f"{partition.rel} (+{len(partition.files) - 1} files)"
    )
    span = f" [{partition.start}:{partition.end}]" if partition.start or partition.end >= 0 else ""
    return f"partition {partition.index} of source {partition.source!r} ({where}{span})"
