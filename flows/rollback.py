"""Rollback of a bad dataset version: restore ``main``, mark what trained on the bad data, resume.

``tokenlake rollback --to REF`` (or the ``rollback`` flow) does, in order:

1. **Refuse** what must not happen: a target that is not an ancestor of ``main``, and any
   rollback while a curate run is publishing (the publish lock of :mod:`flows.wap` is held
   for the whole restore, so no publish can start half-way either). When ``main`` already
   holds the target's content there is nothing to restore: the rollback only marks the
   checkpoints trained on reverted data that carry no mark yet (saved after an earlier
   rollback, or recorded late), and refuses when there are none.
2. **Restore** ``main`` to the target's content with new commits, so history is kept: the
   commits on ``main``'s first-parent line newer than the target are reverted newest first
   (a publish merge against its first parent), stopping as soon as ``main``'s content equals
   the target's. If a revert conflicts, or reverts cannot reach the target (it came in
   through a merge's second parent), one ``restore`` commit writes the difference. A final
   empty ``rollback`` commit records the event (target, reverted commits, flow run) and is
   tagged ``rollback-YYYYMMDD-N``. ``hard=True`` moves ``main`` to the target instead
   (history after it leaves ``main``; the tag then marks the target).
   ``repo.diff(target, main) == []`` is checked before anything is reported.
3. **Taint** (never delete) checkpoints trained on data no longer on ``main``: the rule of
   :mod:`formats.rollbacks`, over this rollback and every recorded one, decides from each
   checkpoint's data commit. Roughly, a data commit is tainted when it was on ``main`` before
   the rollback and is not reachable from the target (a reverted publish, or a stage commit
   of the curate run that made it), or is built on such a commit (e.g. an unpublished curate
   run started on the bad version). Each tainted checkpoint without a mark yet gets one in
   ``runs/<run>/taints/step-NNNNNNN.json``, and the rollback a record in
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
from flows.restore import RestoredMain, RollbackPlan, restore_main
from flows.taint import (
    ResumePlan,
    find_tainted,
    fork_checkpoint,
    mark_tainted,
    plan_or_marks,
    plan_resumes,
    rollback_record,
)
from flows.train import TrainParams, train_flow
from formats.layout import MAIN
from tasks.stage_task import IO_RETRIES
from versioning import default_repo_spec, open_repo


class RollbackParams(BaseModel):
    """The one parameter of the rollback flow (the Prefect UI renders it as a form)."""

    model_config = ConfigDict(extra="forbid")

    to: str = Field(
        description="the dataset version main goes back to: a ds-* tag or a commit id on main's history"
    )
    hard: bool = Field(
        default=False, description="move main to the target instead of reverting (later history leaves main)"
    )
    resume: bool = Field(
        default=False,
        description="resume each tainted run from its newest untainted checkpoint on the restored main",
    )
    resume_steps: int | None = Field(
        default=None,
        ge=1,
        description="steps the resumed runs train to; default: each run's configured steps",
    )
    repository: str | None = Field(
        default=None,
        description="a local directory or lakefs://REPOSITORY; default $TOKENLAKE_REPO, else the data home's repo folder",
    )


@dataclass(frozen=True)
class ResumedRun:
    run: str
    from_checkpoint: str  # RUN@STEP
    data_commit: str  # what it trains on now: main's head after the rollback
    step: int  # the step it reached
    checkpoint: str | None


MARKS_ONLY = "none"  # the method of a rollback that found main already restored and only marked checkpoints


@dataclass(frozen=True)
class RollbackReport:
    tag: str  # "" when nothing was restored (method MARKS_ONLY)
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
    if plan is None:
        return marks_only(repo_spec, params, flow_run_id)
    restored = restore_task(repo_spec, plan, flow_run_id)
    tainted = taint_task(repo_spec, plan, restored, flow_run_id)
    tainted_table(tainted, f"trained on data that {restored.tag} took off main")
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
    create_markdown_artifact(
        summary_markdown(report), key="rollback-summary", description=f"rollback {report.tag}"
    )
    print(f"rollback {report.tag}: main restored to {plan.target_ref} ({report.method}); "
          f"{len(tainted)} checkpoint(s) tainted, {len(resumed)} run(s) resumed")  # fmt: skip
    return report


def marks_only(repo_spec: str, params: RollbackParams, flow_run_id: str) -> RollbackReport:
    """``main`` already holds the target: mark what was trained on reverted data since, restore nothing."""
    tainted = taint_task(repo_spec, None, None, flow_run_id)
    tainted_table(tainted, "trained on reverted data, marked now")
    repo = open_repo(repo_spec, create=False)
    main = repo.resolve(MAIN)
    report = RollbackReport(
        tag="", flow_run_id=flow_run_id, target_ref=params.to, target=repo.resolve(params.to), method=MARKS_ONLY,
        previous_main=main, main=main, reverted=[], tainted=[c.summary() for c in tainted], resumed=[],
    )  # fmt: skip
    create_markdown_artifact(
        summary_markdown(report), key="rollback-summary", description="rollback: marks only"
    )
    print(
        f"rollback: main already holds {params.to}; {len(tainted)} checkpoint(s) trained on reverted data marked"
    )
    if params.resume:
        print("rollback: nothing was restored, so no run is resumed; continue a run on main with "
              "`tokenlake train --dataset main --run RUN --resume allow-data-change`")  # fmt: skip
    return report


@task(name="plan-rollback", cache_policy=NO_CACHE, **IO_RETRIES)
def plan_task(repo_spec: str, to: str, hard: bool) -> RollbackPlan | None:
    """The plan; None when main already holds ``to`` and only marks are due (:func:`flows.taint.plan_or_marks`)."""
    return plan_or_marks(open_repo(repo_spec, create=False), to, hard)


@task(name="restore-main", cache_policy=NO_CACHE)  # not retried: a half-done restore is planned afresh
def restore_task(repo_spec: str, plan: RollbackPlan, flow_run_id: str) -> RestoredMain:
    restored = restore_main(open_repo(repo_spec, create=False), plan, flow_run_id)
    get_run_logger().info(
        "rollback: main restored to %s by %s, tagged %s", plan.target_ref, restored.method, restored.tag
    )
    return restored


@task(
    name="taint-checkpoints", cache_policy=NO_CACHE, **IO_RETRIES
)  # rewrites the same records: safe to retry
def taint_task(
    repo_spec: str, plan: RollbackPlan | None, restored: RestoredMain | None, flow_run_id: str
) -> list[CheckpointRecord]:
    """Mark every checkpoint trained on reverted data that has no mark yet; with a restore, record the rollback."""
    repo = open_repo(repo_spec, create=False)
    record = rollback_record(repo, plan, restored, flow_run_id) if plan and restored else None
    tainted = find_tainted(repo, read_lineage(repo), record)
    if tainted or record is not None:
        mark_tainted(repo, tainted, record, flow_run_id)
    return tainted


def tainted_table(tainted: list[CheckpointRecord], what: str) -> None:
    rows = [
        {"checkpoint": c.name, "run": c.run, "step": c.step, "tokens": c.tokens,
         "loss": c.metrics.get("loss", ""), "data_commit": c.data_commit[:12],
         "tainted_by": c.reverted.rollback if c.reverted else "", "path": c.checkpoint}
        for c in tainted
    ]  # fmt: skip
    create_table_artifact(
        rows,
        key="rollback-tainted",
        description=f"{len(rows)} checkpoint(s) {what} (marked in lineage, never deleted)",
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
    restored = (
        f"main restored to **{report.target_ref}** (`{report.target[:12]}`) by {report.method}; "
        f"main was `{report.previous_main[:12]}`, is `{report.main[:12]}`."
        if report.method != MARKS_ONLY
        else f"main already held **{report.target_ref}** (`{report.target[:12]}`): nothing restored."
    )
    lines = [
        f"# Rollback {report.tag or report.target_ref}",
        "",
        restored,
        "",
        f"Reverted: {', '.join(f'`{c[:12]}`' for c in report.reverted) or 'none'}",
        "",
        f"Tainted checkpoints: {', '.join(t['checkpoint'] for t in report.tainted) or 'none'}",
    ]
    for run in report.resumed:
        lines.append(f"\nResumed **{run.run}** from {run.from_checkpoint} on `{run.data_commit[:12]}` "
                     f"to step {run.step}.")  # fmt: skip
    return "\n".join(lines) + "\n"
