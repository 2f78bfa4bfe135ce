"""The Prefect task of the ingest stage: a thin wrapper around :func:`tasks.ingest.stage.run_ingest`.

It adds retries on transient storage errors (never on bad data, a misconfiguration or a
failed gate), logging, and a table artifact of documents in / kept / rejected by reason.
"""

from __future__ import annotations

from prefect import task

from tasks.ingest.config import IngestConfig
from tasks.ingest.stage import run_ingest
from tasks.stage import StageResult
from tasks.stage_task import IO_RETRIES, stage_logger, stage_table_artifact
from versioning import open_repo


@task(name="ingest", **IO_RETRIES)
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
    stage_table_artifact(result)
    return result
