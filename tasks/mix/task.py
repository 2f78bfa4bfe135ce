"""The Prefect task of the mix stage: a thin wrapper around :func:`tasks.mix.stage.run_mix`."""

from __future__ import annotations

from prefect import task

from formats.mix import MixSpec
from tasks.mix.stage import run_mix
from tasks.stage import StageResult
from tasks.stage_task import IO_RETRIES, run_stage_task


@task(name="mix", **IO_RETRIES)
def mix_task(
    repo_spec: str, branch: str, config: MixSpec, input_commit: str, flow_run_id: str | None = None
) -> StageResult:
    """``mix.json`` resolved from ``config`` and the manifest at ``input_commit``, committed on ``branch``."""
    return run_stage_task(run_mix, repo_spec, branch, input_commit, config, flow_run_id)
