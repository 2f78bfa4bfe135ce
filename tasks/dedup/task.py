"""The Prefect task of the dedup stage: a thin wrapper around :func:`tasks.dedup.stage.run_dedup_stage`.

It adds retries on transient storage errors (never on bad data or a misconfiguration),
logging, and a table artifact of documents in / kept / rejected by reason per source.
"""

from __future__ import annotations

from prefect import task

from tasks.dedup.config import DedupConfig
from tasks.dedup.stage import run_dedup_stage
from tasks.stage import StageResult
from tasks.stage_task import IO_RETRIES, stage_logger, stage_table_artifact
from versioning import open_repo


@task(name="dedup", **IO_RETRIES)
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
    stage_table_artifact(result, f" ({extra['mode']})")
    return result

