"""Rollback of a bad dataset version: restore ``main``, mark what trained on the bad data, resume.

``tokenlake rollback --to REF`` (or the ``rollback`` flow) does, in order:

1. **Refuse** what must not happen: a target that is not an ancestor of ``main``, a target
   whose content ``main`` already holds, and any rollback while a curate run is publishing
   (the publish lock of :mod:`flows.wap` is held for the whole restore, so no publish can
   start half-way either).
2. **Restore** ``main`` to the target's content with new commits, so history is kept: the
   commits on ``main``'s first-parent line newer than the target are reverted newest first
   (a publish merge against its first parent), stopping as soon as ``main``'s content equals
   the target's. If a revert conflicts, or reverts cannot reach the target (it came in
   through a merge's second parent), one ``restore`` commit writes the difference. A final
   empty ``rollback`` commit records the event (target, reverted commits, flow run) and is
   tagged ``rollback-YYYYMMDD-N``. ``hard=True`` moves ``main`` to the target instead
   (history after it leaves ``main``; the tag then marks the target).
   ``repo.diff(target, main) == []`` is checked before anything is reported.
3. **Taint** (never delete) checkpoints trained on data no longer on ``main``. Precisely, a
   checkpoint whose data commit ``c`` is

   * reachable from ``main``'s head before the rollback and not from the target (a reverted
     publish, or a stage commit of the curate run that made it), or
   * not on ``main``'s history but descended from such a commit (e.g. an unpublished curate
     run started on the bad version).

   Commits of the rollback itself and the target's ancestors are never tainted. Each gets a
   mark in ``runs/<run>/taints/step-NNNNNNN.json`` and the rollback a record in
   ``runs/_rollbacks/<tag>.json``, in one commit on branch ``runs``.
4. **Resume** (optional): for each run with tainted checkpoints, its newest untainted
   checkpoint whose files still verify is forked into a new run ``<run>-<rollback tag>``
   (files hard-linked; the tainted run is left as it was) and trained by the train flow
   (:mod:`flows.train`, a subflow) on ``main``'s new head with ``resume="allow-data-change"``,
   so the trainer records the switch as a deliberate data change; the fork is recorded as a
   ``fork`` event and as the new run's first checkpoint record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.context import get_run_context
from pydantic import BaseModel, ConfigDict, Field

from flows.lineage import CheckpointRecord, read_lineage
from flows.restore import RestoredMain, RollbackPlan, plan_rollback, restore_main
from flows.taint import ResumePlan, find_tainted, fork_checkpoint, mark_tainted, plan_resumes
from flows.train import TrainParams, train_flow
from tasks.stage_task import IO_RETRIES
from versioning import default_repo_spec, open_repo


class RollbackParams(BaseModel):
    """The one parameter of the rollback flow (the Prefect UI renders it as a form)."""

    model_config = ConfigDict(extra="forbid")

    to: str = Field(description="the dataset version main goes back to: a ds-* tag or a commit id on main's history")
    hard: bool = Field(
        default=False, description="move main to the target instead of reverting (later history leaves main)"
    )
    resume: bool = Field(
        default=False, description="resume each tainted run from its newest untainted checkpoint on the restored main"
    )
    resume_steps: int | None = Field(
        default=None, ge=1, description="steps the resumed runs train to; default: each run's configured steps"
    )
    repository: str | None = Field(
        default=None, description="a local directory or lakefs://REPOSITORY; default $TOKENLAKE_REPO, else the data home's repo folder"
    )


@dataclass(frozen=True)
class ResumedRun:
    run: str
    from_checkpoint: str  # RUN@STEP
    data_commit: str  # what it trains on now: main's head after the rollback
    step: int  # the step it reached
    checkpoint: str | None


@dataclass(frozen=True)
class RollbackReport:
    tag: str
    flow_run_id: str
    target_ref: str
    target: str
    method: str
    previous_main: str
    main: str
    reverted: list[str]
    tainted: list[dict[str, Any]]
    resumed: list[ResumedRun]


@flow(name="rollback", log_prints=True)
def rollback(params: RollbackParams) -> RollbackReport:
    """Restore main to an earlier dataset version, taint the checkpoints trained on what left it, resume."""
    flow_run_id = str(get_run_context().flow_run.id)
    repo_spec = params.repository or default_repo_spec()
    plan = plan_task(repo_spec, params.to, params.hard)
    restored = restore_task(repo_spec, plan, flow_run_id)
    tainted = taint_task(repo_spec, plan, restored, flow_run_id)
    tainted_table(restored, tainted)
    resumed = []
    if params.resume:
        for resume in plan_resumes(read_lineage(open_repo(repo_spec, create=False)), tainted, restored,
                                   params.resume_steps, warn=print):  # fmt: skip
            fork_task(repo_spec, resume, restored.tag, flow_run_id)
            trained = train_flow(resume_params(resume, repo_spec))
            resumed.append(ResumedRun(resume.run, resume.from_checkpoint.name, trained.data_commit,
                                      trained.step, trained.checkpoint))  # fmt: skip
    report = RollbackReport(
        tag=restored.tag, flow_run_id=flow_run_id, target_ref=plan.target_ref, target=plan.target,
        method=restored.method, previous_main=restored.previous_head, main=restored.head, reverted=list(restored.reverted),
        tainted=[c.summary() for c in tainted], resumed=resumed,
    )  # fmt: skip
    create_markdown_artifact(summary_markdown(report), key="rollback-summary", description=f"rollback {report.tag}")
    print(f"rollback {report.tag}: main restored to {plan.target_ref} ({report.method}); "
          f"{len(tainted)} checkpoint(s) tainted, {len(resumed)} run(s) resumed")  # fmt: skip
    return report


@task(name="plan-rollback", cache_policy=NO_CACHE, **IO_RETRIES)
def plan_task(repo_spec: str, to: str, hard: bool) -> RollbackPlan:
    return plan_rollback(open_repo(repo_spec, create=False), to, hard)


@task(name="restore-main", cache_policy=NO_CACHE)  # not retried: a half-done restore is planned afresh
def restore_task(repo_spec: str, plan: RollbackPlan, flow_run_id: str) -> RestoredMain:
    restored = restore_main(open_repo(repo_spec, create=False), plan, flow_run_id)
    get_run_logger().info("rollback: main restored to %s by %s, tagged %s", plan.target_ref, restored.method, restored.tag)
    return restored


@task(name="taint-checkpoints", cache_policy=NO_CACHE, **IO_RETRIES)  # rewrites the same records: safe to retry
def taint_task(repo_spec: str, plan: RollbackPlan, restored: RestoredMain, flow_run_id: str) -> list[CheckpointRecord]:
    repo = open_repo(repo_spec, create=False)
    index = read_lineage(repo)
    tainted = find_tainted(repo, index, plan, restored)
    mark_tainted(repo, index, plan, restored, tainted, flow_run_id)
    return tainted


def tainted_table(restored: RestoredMain, tainted: list[CheckpointRecord]) -> None:
    rows = [
        {"checkpoint": c.name, "run": c.run, "step": c.step, "tokens": c.tokens,
         "loss": c.metrics.get("loss", ""), "data_commit": c.data_commit[:12], "path": c.checkpoint}
        for c in tainted
    ]  # fmt: skip
    create_table_artifact(
        rows,
        key="rollback-tainted",
        description=f"{len(rows)} checkpoint(s) trained on data that {restored.tag} took off main "
        "(marked in lineage, never deleted)",
    )


@task(name="fork-run", cache_policy=NO_CACHE, **IO_RETRIES)
def fork_task(repo_spec: str, resume: ResumePlan, rollback_tag: str, flow_run_id: str) -> None:
    fork_checkpoint(open_repo(repo_spec, create=False), resume, rollback_tag, flow_run_id)


def resume_params(resume: ResumePlan, repo_spec: str) -> TrainParams:
    """The train flow's parameters that continue ``resume``'s checkpoint with its run's own config."""
    config = resume.config
    set_by_params = {"run", "commit", "repo", "steps", "resume", "flow_run_id", "progress"}
    return TrainParams(
        dataset=config["commit"],
        run=resume.run,
        steps=config["steps"],
        nproc=int(resume.from_checkpoint.record.get("world_size", 1)),
        resume="allow-data-change",  # the trainer records the switch to the restored commit
        repo=repo_spec,
        overrides={k: v for k, v in config.items() if k not in set_by_params},
    )


def summary_markdown(report: RollbackReport) -> str:
    lines = [
        f"# Rollback {report.tag}",
        "",
        f"main restored to **{report.target_ref}** (`{report.target[:12]}`) by {report.method}; "
        f"main was `{report.previous_main[:12]}`, is `{report.main[:12]}`.",
        "",
        f"Reverted: {', '.join(f'`{c[:12]}`' for c in report.reverted) or 'none'}",
        "",
        f"Tainted checkpoints: {', '.join(t['checkpoint'] for t in report.tainted) or 'none'}",
    ]
    for run in report.resumed:
        lines.append(f"\nResumed **{run.run}** from {run.from_checkpoint} on `{run.data_commit[:12]}` "
                     f"to step {run.step}.")  # fmt: skip
    return "\n".join(lines) + "\n"
