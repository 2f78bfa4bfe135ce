"""The Prefect task of the shard stage: a thin wrapper around :func:`tasks.shard.stage.run_shard_stage`.

One task trains (or reuses) the tokenizer and writes the shards, in one commit. It adds
retries on transient storage errors (never on bad data, a misconfiguration or a failed
gate), logging, a progress artifact while it packs, and a table artifact of the result.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.artifacts import create_progress_artifact, create_table_artifact, update_progress_artifact
from prefect.context import TaskRunContext

from tasks.shard.config import ShardConfig
from tasks.shard.stage import run_shard_stage
from tasks.stage import StageResult
from tasks.stage_task import IO_RETRIES, stage_logger
from versioning import open_repo


@task(name="shard", **IO_RETRIES)
def shard_task(
    repo_spec: str, branch: str, config: ShardConfig, input_commit: str, flow_run_id: str | None = None
) -> StageResult:
    """Tokenizer + shards of ``dedup/`` at ``input_commit``, committed on ``branch``."""
    logger = stage_logger(__name__)
    in_run = TaskRunContext.get() is not None
    progress_id = create_progress_artifact(0.0, description="shard: Parquet parts packed") if in_run else None
    reported = [0]

    def progress(fraction: float) -> None:
        percent = int(fraction * 100)
        if progress_id is not None and percent > reported[0]:
            update_progress_artifact(progress_id, percent)
            reported[0] = percent

    logger.info("shard: input commit %s, branch %s, config %s", input_commit, branch, config.model_dump())
    result = run_shard_stage(open_repo(repo_spec), branch, config, input_commit, flow_run_id, progress)
    report = result.report
    extra = report["extra"]
    logger.info(
        "shard: %s sequences in %s shards, %s tokens, %.1f MB/s; commit %s",
        extra["sequences"],
        extra["shards"],
        report["tokens"],
        extra["megabytes_per_second"],
        result.commit_id,
    )
    for source, reason in extra["sources_without_shards"].items():
        logger.warning("shard: source %s has no shards: %s", source, reason)
    if in_run:
        create_table_artifact(
            table=stage_table(report),
            key="shard-stage",
            description=f"shard stage, commit {result.commit_id}, tokenizer {extra['tokenizer']['sha256'][:12]}",
        )
    return result


def stage_table(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per source: documents in/kept/rejected by reason, tokens, sequences, shards."""
    rows = []
    for source, s in sorted(report["per_source"].items()):
        rows.append(
            {
                "source": source,
                "documents_in": s["documents_in"],
                "kept": s["kept"],
                **{f"rejected_{reason}": n for reason, n in sorted(s["rejected"].items())},
                "repeated_copies": s["repeated_copies"],
                "tokens": s["stored_tokens"],
                "sequences": s["sequences"],
                "shards": s["shards"],
                "tail_tokens_dropped": s["tail_tokens_dropped"],
                "note": s["reason"],
                "seconds": s["seconds"],
            }
        )
    return rows
