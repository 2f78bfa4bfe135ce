"""The Prefect task of the validate stage: a thin wrapper around :func:`tasks.validate.stage.run_validate`.

It adds retries on transient storage errors (never on bad data, a misconfiguration or a
failed gate), logging, and a table artifact of documents in / kept / rejected by reason.
"""

from __future__ import annotations

from prefect import task

from tasks.stage import StageResult
from tasks.stage_task import IO_RETRIES, stage_logger, stage_table_artifact
from tasks.validate.config import ValidateConfig
from tasks.validate.stage import run_validate
from versioning import open_repo


@task(name="validate", **IO_RETRIES)
def validate_task(
    repo_spec: str, branch: str, config: ValidateConfig, input_commit: str, flow_run_id: str | None = None
) -> StageResult:
    """``raw/`` at ``input_commit`` through the quality filters into ``filtered/`` on ``branch``, one commit."""
    log = stage_logger(__name__)
    log.info("validate: raw/ at %s onto branch %s", input_commit, branch)
    result = run_validate(open_repo(repo_spec), branch, config, input_commit, flow_run_id)
    report = result.report
    log.info(
        "validate: kept %s of %s, rejected %s; classifier %s; gate %s; %.1f s; commit %s",
        report["kept"],
        report["documents_in"],
        report["rejected"],
        report["extra"]["classifier"],
        (report["expectations"] or {}).get("summary", "disabled"),
        report["seconds"],
        result.commit_id,
    )
    stage_table_artifact(result)
    return result
