"""Stage plumbing shared by every curate stage: document schema, Parquet parts in the
repository, stage reports, and the commit that ends a stage.

A stage is: read its input at a commit id, compute, write ``<out>/<source>/part-NNNNN.parquet``
and ``quarantine/<stage>/<source>/part-NNNNN.parquet``, write ``reports/<stage>.json``, then
:func:`commit_stage`. Re-running a stage on the same branch first clears its outputs
(:func:`clear_prefix`), so a retry never duplicates documents.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from formats import layout
from versioning import DataRepo, validate_path

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


def tokenlake_version() -> str:
    try:
        return version("tokenlake")
    except PackageNotFoundError:
        return "0+unknown"


def document_id(source: str, locator: str) -> str:
    """Stable id: sha256 of source and locator."""
    return hashlib.sha256(f"{source}\0{locator}".encode()).hexdigest()


def config_hash(config: Any) -> str:
    """A short, stable hash of a stage config (pydantic model, dataclass or plain data)."""
    if hasattr(config, "model_dump"):
        config = config.model_dump(mode="json")
    elif hasattr(config, "__dataclass_fields__"):
        config = asdict(config)
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def with_quarantine_reason(table: pa.Table, stage: str, reasons: pa.Array | list[str]) -> pa.Table:
    """Add ``stage`` and ``reason`` columns to rejected rows (every input column kept)."""
    n = table.num_rows
    table = table.append_column("stage", pa.array([stage] * n, pa.string()))
    return table.append_column("reason", pa.array(reasons, pa.string()))


@dataclass
class StageReport:
    """What a stage did; the invariant documents_in == kept + sum(rejected) is checked."""

    stage: str
    documents_in: int = 0
    kept: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    seconds: float = 0.0
    per_source: dict[str, dict[str, Any]] = field(default_factory=dict)
    expectations: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    def reject(self, reason: str, count: int = 1) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + count

    def check_balance(self) -> None:
        if self.documents_in != self.kept + self.rejected_total:
            raise AssertionError(
                f"stage {self.stage}: documents in ({self.documents_in}) != kept ({self.kept}) "
                f"+ rejected ({self.rejected_total}); documents were lost"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"rejected_total": self.rejected_total}


@dataclass(frozen=True)
class StageResult:
    """What a stage task returns to the flow: the commit that ended it and its report."""

    stage: str
    commit_id: str
    report: dict[str, Any]


class PartWriter:
    """Writes a stream of Arrow tables as ``<prefix>/part-NNNNN.parquet`` of about ``rows_per_part`` rows."""

    def __init__(self, repo: DataRepo, branch: str, prefix: str, rows_per_part: int = 50_000):
        self.repo = repo
        self.branch = branch
        self.prefix = validate_path(prefix.rstrip("/"))
        self.rows_per_part = rows_per_part
        self.paths: list[str] = []
        self.rows = 0
        self._pending: list[pa.Table] = []
        self._pending_rows = 0

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        self._pending.append(table)
        self._pending_rows += table.num_rows
        while self._pending_rows >= self.rows_per_part:
            merged = pa.concat_tables(self._pending, promote_options="default")
            self._flush(merged.slice(0, self.rows_per_part))
            rest = merged.slice(self.rows_per_part)
            self._pending = [rest] if rest.num_rows else []
            self._pending_rows = rest.num_rows

    def close(self) -> list[str]:
        if self._pending_rows:
            self._flush(pa.concat_tables(self._pending, promote_options="default"))
        self._pending, self._pending_rows = [], 0
        return self.paths

    def _flush(self, table: pa.Table) -> None:
        path = f"{self.prefix}/{layout.part_name(len(self.paths))}"
        with tempfile.NamedTemporaryFile(suffix=".parquet", delete=False) as tmp:
            tmp_path = tmp.name
        try:
            pq.write_table(table.combine_chunks(), tmp_path, compression="zstd")
            self.repo.put(self.branch, path, tmp_path)
        finally:
            os.unlink(tmp_path)
        self.paths.append(path)
        self.rows += table.num_rows

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()


def list_parts(repo: DataRepo, ref: str, prefix: str) -> list[str]:
    return [o.path for o in repo.list(ref, prefix.rstrip("/") + "/") if o.path.endswith(".parquet")]


def read_parts(repo: DataRepo, ref: str, prefix: str, columns: list[str] | None = None) -> Iterator[pa.Table]:
    """Each Parquet part under ``prefix`` at ``ref``, in path order (one part in memory at a time)."""
    for path in list_parts(repo, ref, prefix):
        yield read_part(repo, ref, path, columns)


def read_part(repo: DataRepo, ref: str, path: str, columns: list[str] | None = None) -> pa.Table:
    with repo.open(ref, path) as f:
        data = f.read()
    return pq.read_table(pa.BufferReader(data), columns=columns)


def list_sources(repo: DataRepo, ref: str, prefix: str) -> list[str]:
    """The ``<source>`` folder names directly under ``prefix``."""
    base = prefix.rstrip("/") + "/"
    names = {o.path[len(base) :].split("/", 1)[0] for o in repo.list(ref, base)}
    return sorted(n for n in names if n)


def clear_prefix(repo: DataRepo, branch: str, prefix: str) -> int:
    """Stage the removal of everything under ``prefix``; returns how many objects."""
    paths = [o.path for o in repo.list(branch, prefix.rstrip("/") + "/")]
    for path in paths:
        repo.delete(branch, path)
    return len(paths)


def put_json(repo: DataRepo, branch: str, path: str, obj: Any) -> None:
    data = json.dumps(obj, indent=2, sort_keys=True, default=str).encode()
    repo.put(branch, path, io.BytesIO(data))


def stage_metadata(
    stage: str, stage_config_hash: str, input_commit: str, flow_run_id: str | None, report: StageReport
) -> dict[str, str]:
    """Commit metadata every stage commit carries (DESIGN.md section 3)."""
    return {
        "stage": stage,
        "stage_config_hash": stage_config_hash,
        "input_commit": input_commit,
        "flow_run_id": flow_run_id or "",
        "tokenlake_version": tokenlake_version(),
        "documents_in": str(report.documents_in),
        "kept": str(report.kept),
        "rejected": str(report.rejected_total),
        "tokens": str(report.tokens),
    }


def commit_stage(
    repo: DataRepo,
    branch: str,
    report: StageReport,
    stage_config_hash: str,
    input_commit: str,
    flow_run_id: str | None = None,
    metadata: dict[str, str] | None = None,
) -> str:
    """Write ``reports/<stage>.json`` and commit the stage; returns the commit id."""
    report.check_balance()
    put_json(repo, branch, layout.report_path(report.stage), report.to_dict())
    meta = stage_metadata(report.stage, stage_config_hash, input_commit, flow_run_id, report) | (metadata or {})
    # allow_empty: a retried stage may rewrite byte-identical outputs, and every stage still
    # ends in its own commit (the next stage's input, and the stage's cache entry)
    return repo.commit(
        branch, f"{report.stage}: kept {report.kept} of {report.documents_in}", meta, allow_empty=True
    ).id


class Stopwatch:
    def __enter__(self) -> Stopwatch:
        self.start = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


def iter_batches(tables: Iterable[pa.Table], batch_rows: int) -> Iterator[pa.Table]:
    """Re-chunk a stream of tables into tables of at most ``batch_rows`` rows."""
    for table in tables:
        for start in range(0, table.num_rows, batch_rows):
            yield table.slice(start, batch_rows)
