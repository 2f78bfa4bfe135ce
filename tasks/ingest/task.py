"""The Prefect task of the ingest stage: a thin wrapper around :func:`tasks.ingest.stage.run_ingest`.

It adds retries on transient storage errors (never on bad data, a misconfiguration or a
failed gate), logging, and a table artifact of documents in / kept / rejected by reason.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.context import TaskRunContext

from tasks.ingest.config import IngestConfig
from tasks.ingest.stage import run_ingest
from tasks.io import StageResult
from tasks.runtime import STAGE_RETRIES, stage_logger
from versioning import open_repo


def stage_table(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per source and a total: documents in, kept, rejected by reason, seconds."""
    reasons = sorted(report["rejected"])
    rows = [
        {
            "source": name,
            "documents_in": s["documents_in"],
            "kept": s["kept"],
            **{f"rejected_{r}": s["rejected"].get(r, 0) for r in reasons},
        }
        for name, s in sorted(report["per_source"].items())
    ]
    rows.append(
        {
            "source": "(all)",
            "documents_in": report["documents_in"],
            "kept": report["kept"],
            **{f"rejected_{r}": report["rejected"][r] for r in reasons},
            "seconds": round(report["seconds"], 2),
        }
    )
    return rows


@task(name="ingest", **STAGE_RETRIES)
def ingest_task(
    repo_spec: str, branch: str, config: IngestConfig, input_commit: str, flow_run_id: str | None = None
) -> StageResult:
    """Every configured source into ``raw/`` and ``quarantine/ingest/`` on ``branch``, one commit."""
    log = stage_logger(__name__)
    log.info("ingest: %d source(s) onto branch %s from %s", len(config.sources), branch, input_commit)
    result = run_ingest(open_repo(repo_spec), branch, config, input_commit, flow_run_id)
    report = result.report
    log.info(
        "ingest: kept %s of %s, rejected %s; gate %s; %.1f s; commit %s",
        report["kept"],
        report["documents_in"],
        report["rejected"],
        (report["expectations"] or {}).get("summary", "disabled"),
        report["seconds"],
        result.commit_id,
    )
    if TaskRunContext.get() is not None:
        create_table_artifact(
            table=stage_table(report),
            key="ingest-stage",
            description=f"ingest stage, commit {result.commit_id}",
        )
    return result
