"""The Prefect task of the shard stage: a thin wrapper around :func:`tasks.shard.stage.run_shard`.

One task trains (or reuses) the tokenizer and writes the shards, in one commit. Besides what
every stage task does (retries on transient storage errors only, logging, a table artifact),
it shows a progress artifact while it packs and warns about sources that yield no shard.
"""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.context import TaskRunContext

from tasks.shard.config import ShardConfig
from tasks.shard.stage import run_shard
from tasks.stage import StageResult
from tasks.stage_task import IO_RETRIES, run_stage_task, stage_logger


@task(name="shard", **IO_RETRIES)
def shard_task(
    repo_spec: str, branch: str, config: ShardConfig, input_commit: str, flow_run_id: str | None = None
) -> StageResult:
    """Tokenizer + shards of ``dedup/`` at ``input_commit``, committed on ``branch``."""
    in_run = TaskRunContext.get() is not None
    progress_id = (
        create_progress_artifact(0.0, key="shard-progress", description="shard: Parquet parts packed")
        if in_run
        else None
    )
    reported = [0]

    def progress(fraction: float) -> None:
        percent = int(fraction * 100)
        if progress_id is not None and percent > reported[0]:
            update_progress_artifact(progress_id, percent)
            reported[0] = percent

    result = run_stage_task(
        run_shard, repo_spec, branch, input_commit, config, flow_run_id, progress=progress
    )
    for source, reason in result.report["extra"]["sources_without_shards"].items():
        stage_logger(__name__).warning("shard: source %s has no shards: %s", source, reason)
    return result
