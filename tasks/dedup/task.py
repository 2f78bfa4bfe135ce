"""The Prefect task of the dedup stage: a thin wrapper around :func:`tasks.dedup.stage.run_dedup`
(retries on transient storage errors only, logging, a table artifact)."""

from __future__ import annotations

from prefect import task

from tasks.dedup.config import DedupConfig
from tasks.dedup.stage import run_dedup
from tasks.stage import StageResult
from tasks.stage_task import IO_RETRIES, run_stage_task


@task(name="dedup", **IO_RETRIES)
def dedup_task(
    repo_spec: str, branch: str, config: DedupConfig, input_commit: str, flow_run_id: str | None = None
) -> StageResult:
    """Exact and near-duplicate removal (or soft weights) of ``filtered/`` at ``input_commit``."""
    return run_stage_task(run_dedup, repo_spec, branch, input_commit, config, flow_run_id)
