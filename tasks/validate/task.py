"""The Prefect task of the validate stage: a thin wrapper around :func:`tasks.validate.stage.run_validate`
(retries on transient storage errors only, logging, a table artifact)."""

from __future__ import annotations

from prefect import task

from tasks.stage import StageResult
from tasks.stage_task import IO_RETRIES, run_stage_task
from tasks.validate.config import ValidateConfig
from tasks.validate.stage import run_validate


@task(name="validate", **IO_RETRIES)
def validate_task(
    repo_spec: str, branch: str, config: ValidateConfig, input_commit: str, flow_run_id: str | None = None
) -> StageResult:
    """``raw/`` at ``input_commit`` through the quality filters into ``filtered/`` on ``branch``, one commit."""
    return run_stage_task(run_validate, repo_spec, branch, input_commit, config, flow_run_id)
