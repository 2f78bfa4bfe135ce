"""The Prefect task of the ingest stage: a thin wrapper around :func:`tasks.ingest.stage.run_ingest`
(retries on transient storage errors only, logging, a table artifact)."""

from __future__ import annotations

from prefect import task

from tasks.ingest.config import IngestConfig
from tasks.ingest.stage import run_ingest
from tasks.stage import StageResult
from tasks.stage_task import IO_RETRIES, run_stage_task


@task(name="ingest", **IO_RETRIES)
def ingest_task(
    repo_spec: str, branch: str, config: IngestConfig, input_commit: str, flow_run_id: str | None = None
) -> StageResult:
    """Every configured source into ``raw/`` and ``quarantine/ingest/`` on ``branch``, one commit."""
    return run_stage_task(run_ingest, repo_spec, branch, input_commit, config, flow_run_id)
