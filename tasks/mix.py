"""The mix stage: resolve a :class:`~formats.mix.MixSpec` against ``shards/manifest.json`` at
the input commit into ``mix.json`` (and ``reports/mix.json``), in one commit.

The math lives in :mod:`formats.mix`, shared with the training loader; this module only
reads the manifest, writes the plan and reports it. A spec that cannot be resolved fails the
stage with :class:`~formats.mix.MixSpecError` (one sentence) before anything is written.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.context import TaskRunContext

from formats import layout
from formats.mix import MixPlan, MixSpec, resolve_mix
from formats.shards import Manifest
from tasks.stage import StageReport, StageResult, commit_stage, config_hash
from tasks.stage_task import IO_RETRIES, stage_logger
from versioning import DataRepo, NotFound, open_repo

STAGE = "mix"


def run_mix_stage(
    repo: DataRepo, branch: str, config: MixSpec, input_commit: str, flow_run_id: str | None = None
) -> StageResult:
    started = time.perf_counter()
    try:
        manifest = Manifest.from_json(repo.get(input_commit, layout.MANIFEST))
    except NotFound:
        raise ValueError(f"no {layout.MANIFEST} at commit {input_commit}; run the shard stage first") from None
    plan = resolve_mix(config, manifest.sources, manifest.seq_len)
    repo.put(branch, layout.MIX, plan.to_json().encode())

    report = StageReport(stage=STAGE, tokens=plan.total_tokens)
    report.per_source = source_rows(plan)
    report.seconds = round(time.perf_counter() - started, 3)
    report.extra = {
        "mix_sha256": plan.sha256(),
        "manifest_sha256": manifest.sha256(),
        "seq_len": plan.seq_len,
        "total_samples": plan.total_samples,
        "total_tokens": plan.total_tokens,
        "phases": [{"start_sample": p.start, "stop_sample": p.stop} for p in plan.phases],
        "seed": plan.seed,
    }
    metadata = {"mix_sha256": plan.sha256(), "manifest_sha256": manifest.sha256()}
    commit_id = commit_stage(repo, branch, report, config_hash(config), input_commit, flow_run_id, metadata)
    return StageResult(stage=STAGE, commit_id=commit_id, report=report.to_dict())


def source_rows(plan: MixPlan) -> dict[str, dict[str, Any]]:
    """Per source: what the manifest holds, its target weight in each phase, and its resolved budget."""
    rows = {}
    for i, name in enumerate(plan.source_names):
        rows[name] = {
            "sequences": plan.source_sequences[i],
            "tokens": plan.source_tokens[i],
            "weights": [round(p.weights[i], 6) for p in plan.phases],
            "samples": plan.samples[i],
            "token_budget": plan.token_budgets[i],
            "epochs": round(plan.epochs[i], 4),
            "max_epochs": plan.max_epochs[i],
        }
    return rows


@task(name="mix", **IO_RETRIES)
def mix_task(
    repo_spec: str, branch: str, config: MixSpec, input_commit: str, flow_run_id: str | None = None
) -> StageResult:
    """``mix.json`` resolved from ``config`` and the manifest at ``input_commit``, committed on ``branch``."""
    in_run = TaskRunContext.get() is not None
    logger = stage_logger(__name__)
    result = run_mix_stage(open_repo(repo_spec), branch, config, input_commit, flow_run_id)
    extra = result.report["extra"]
    logger.info(
        "mix: %s samples (%s tokens) over %s sources, mix sha256 %s; commit %s",
        extra["total_samples"],
        extra["total_tokens"],
        len(result.report["per_source"]),
        extra["mix_sha256"][:12],
        result.commit_id,
    )
    if in_run:
        rows = [{"source": name} | row for name, row in sorted(result.report["per_source"].items())]
        for row in rows:
            row["weights"] = ", ".join(f"{w:g}" for w in row["weights"])
        rows.append(
            {"source": "(all)", "token_budget": extra["total_tokens"], "seconds": result.report["seconds"]}
        )
        create_table_artifact(
            table=rows, key="mix-stage", description=f"mix stage, commit {result.commit_id}"
        )
    return result
