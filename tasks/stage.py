"""What every curate stage shares: its report, the commit that ends it, and the error a
misconfiguration raises.

A stage reads its input at a commit id, computes, writes ``<out>/<source>/part-NNNNN.parquet``
and ``quarantine/<stage>/<source>/part-NNNNN.parquet`` (:mod:`tasks.parts`), writes
``reports/<stage>.json``, then :func:`commit_stage`. Re-running a stage on the same branch
first clears its outputs, so a retry never duplicates documents.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from formats import layout
from tasks.parts import put_json
from versioning import DataRepo


class ConfigError(ValueError):
    """A misconfiguration found before any work; the message names what to fix."""


def tokenlake_version() -> str:
    try:
        return version("tokenlake")
    except PackageNotFoundError:
        return "0+unknown"


def config_hash(config: Any) -> str:
    """A short, stable hash of a stage config (pydantic model, dataclass or plain data)."""
    if hasattr(config, "model_dump"):
        config = config.model_dump(mode="json")
    elif hasattr(config, "__dataclass_fields__"):
        config = asdict(config)
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


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
    # what the stage commit carries besides the common fields (gate verdict, sha256s, ...);
    # not part of reports/<stage>.json
    commit_metadata: dict[str, str] = field(default_factory=dict)

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
        report = asdict(self) | {"rejected_total": self.rejected_total}
        del report["commit_metadata"]
        return report


@dataclass(frozen=True)
class StageResult:
    """What a stage task returns to the flow: the commit that ended it and its report."""

    stage: str
    commit_id: str
    report: dict[str, Any]


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
    meta = (
        stage_metadata(report.stage, stage_config_hash, input_commit, flow_run_id, report)
        | report.commit_metadata
        | (metadata or {})
    )
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
