"""The Prefect task of the safety stage: a thin wrapper around :func:`tasks.safety.stage.run_safety`
(retries on transient storage errors only, logging, a table artifact)."""

from __future__ import annotations

from prefect import task

from tasks.safety.config import SafetyConfig
from tasks.safety.stage import run_safety
from tasks.stage import StageResult
from tasks.stage_task import IO_RETRIES, run_stage_task


@task(name="safety", **IO_RETRIES)
def safety_task(
    repo_spec: str, branch: str, config: SafetyConfig, input_commit: str, flow_run_id: str | None = None
) -> StageResult:
    """Blocklists, benchmark decontamination, PII and secrets on ``dedup/`` at ``input_commit``."""
    return run_stage_task(run_safety, repo_spec, branch, input_commit, config, flow_run_id)
