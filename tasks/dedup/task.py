"""The Prefect task of the dedup stage: a thin wrapper around :func:`tasks.dedup.stage.run_dedup_stage`.

It adds retries on transient storage errors (never on bad data or a misconfiguration),
logging, and a table artifact of documents in / kept / rejected by reason per source.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.context import TaskRunContext

from tasks.dedup.config import DedupConfig
from tasks.dedup.stage import run_dedup_stage
from tasks.io import StageResult
from tasks.runtime import STAGE_RETRIES, stage_logger
from versioning import open_repo


@task(name="dedup", **STAGE_RETRIES)
def dedup_task(
    repo_spec: str, branch: str, config: DedupConfig, input_commit: str, flow_run_id: str | None = None
) -> StageResult:
    """Exact and near-duplicate removal (or soft weights) of ``filtered/`` at ``input_commit``."""
    logger = stage_logger(__name__)
    logger.info("dedup: input commit %s, branch %s, config %s", input_commit, branch, config.model_dump())
    result = run_dedup_stage(open_repo(repo_spec), branch, config, input_commit, flow_run_id)
    report, extra = result.report, result.report["extra"]
    logger.info(
        "dedup: kept %s of %s (%s), %s contents hashed, %s reused from %s published; %.1f s; commit %s",
        report["kept"],
        report["documents_in"],
        report["rejected"],
        extra["contents_hashed"],
        extra["published_in_input"],
        extra["published_documents"],
        report["seconds"],
        result.commit_id,
    )
    if TaskRunContext.get() is not None:
        create_table_artifact(
            table=stage_table(report),
            key="dedup-stage",
            description=f"dedup stage ({extra['mode']}), commit {result.commit_id}",
        )
    return result


def stage_table(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per source, plus a total: documents in, kept, rejected by reason, seconds."""
    reasons = sorted(report["rejected"])
    rows = [
        {
            "source": source,
            "documents_in": s["documents_in"],
            "kept": s["kept"],
            **{f"rejected_{r}": s["rejected"].get(r, 0) for r in reasons},
        }
        for source, s in sorted(report["per_source"].items())
    ]
    rows.append(
        {
            "source": "(all)",
            "documents_in": report["documents_in"],
            "kept": report["kept"],
            **{f"rejected_{r}": report["rejected"][r] for r in reasons},
            "seconds": report["seconds"],
        }
    )
    return rows
