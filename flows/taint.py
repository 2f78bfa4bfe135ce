"""The training side of a rollback, without Prefect: mark checkpoints trained on data that left
``main`` (never delete them), and fork a run's newest clean checkpoint to resume on the restored
version.

Steps 3 and 4 of a rollback; :mod:`flows.rollback` is the flow around it and defines which
checkpoints are tainted. :mod:`flows.restore` restores ``main`` (steps 1 and 2).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flows.lineage import CheckpointRecord, LineageIndex, TaintMark, training_config
from flows.restore import RestoredMain, RollbackPlan
from flows.wap import tags_of
from formats.layout import (
    LINEAGE_BRANCH,
    MAIN,
    checkpoint_record_path,
    event_record_path,
    rollback_record_path,
    taint_record_path,
)
from training.checkpoint import CheckpointError, step_dir_name, verify_checkpoint
from versioning import Conflict, DataRepo, NotFound


def tainted_commits(repo: DataRepo, plan: RollbackPlan, restored: RestoredMain, commits: set[str]) -> set[str]:
    """Which of ``commits`` (data commits of checkpoints) hold data that left main (defined in :mod:`flows.rollback`)."""
    tainted = set()
    for commit_id in commits:
        if commit_id in plan.main_history:
            if commit_id in plan.off_main:
                tainted.add(commit_id)
        elif commit_id not in restored.new_commits:
            try:
                history = {c.id for c in repo.log(commit_id)}
            except NotFound:
                continue  # a commit this repository does not have: nothing to say about it
            if history & plan.off_main:
                tainted.add(commit_id)
    return tainted


def find_tainted(
    repo: DataRepo, index: LineageIndex, plan: RollbackPlan, restored: RestoredMain
) -> list[CheckpointRecord]:
    bad = tainted_commits(repo, plan, restored, {c.data_commit for c in index.checkpoints})
    return [c for c in index.checkpoints if c.data_commit in bad]


def mark_tainted(
    repo: DataRepo,
    index: LineageIndex,
    plan: RollbackPlan,
    restored: RestoredMain,
    tainted: list[CheckpointRecord],
    flow_run_id: str,
) -> str:
    """One commit on ``runs``: a taint mark per checkpoint and the rollback's record; returns its id."""
    ensure_runs_branch(repo)
    now = time.time()
    for checkpoint in tainted:
        mark = TaintMark(
            rollback=restored.tag,
            target=plan.target,
            data_commit=checkpoint.data_commit,
            reason=f"data commit {checkpoint.data_commit[:12]} is not on main after {restored.tag} "
            f"(main restored to {plan.target_ref})",
            marked_at=now,
        )
        marks = [asdict(m) for m in checkpoint.taints if m.rollback != restored.tag] + [asdict(mark)]
        put_record(repo, taint_record_path(checkpoint.run, checkpoint.step), {"marks": marks})
    record = {
        "tag": restored.tag,
        "created": now,
        "target": plan.target,
        "target_ref": plan.target_ref,
        "target_tags": tags_of(repo, plan.target),
        "previous_main": restored.previous_head,
        "main": restored.head,
        "method": restored.method,
        "reverted": list(restored.reverted),
        "revert_commits": list(restored.revert_commits),
        "restore_commit": restored.restore_commit,
        "off_main": sorted(plan.off_main),
        "tainted": [c.name for c in tainted],
        "flow_run_id": flow_run_id,
    }
    put_record(repo, rollback_record_path(restored.tag), record)
    meta = {"kind": "rollback", "rollback": restored.tag, "flow_run_id": flow_run_id}
    message = f"rollback {restored.tag}: {len(tainted)} checkpoint(s) tainted"
    return repo.commit(LINEAGE_BRANCH, message, meta, allow_empty=True).id


def put_record(repo: DataRepo, path: str, obj: Any) -> None:
    """Stage a JSON record on branch ``runs``."""
    repo.put(LINEAGE_BRANCH, path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def ensure_runs_branch(repo: DataRepo) -> None:
    if LINEAGE_BRANCH not in repo.list_branches():
        try:
            repo.create_branch(LINEAGE_BRANCH, MAIN)
        except Conflict:  # created meanwhile by a trainer
            pass


# ---- resuming on the restored version ----------------------------------------------------


@dataclass(frozen=True)
class ResumePlan:
    """A tainted run's newest good checkpoint, forked into a new run on main's restored head."""

    from_checkpoint: CheckpointRecord
    run: str
    run_dir: Path
    config: dict[str, Any]  # TrainConfig fields


def plan_resumes(
    index: LineageIndex,
    tainted: list[CheckpointRecord],
    restored: RestoredMain,
    steps: int | None = None,
    warn: Any = print,
) -> list[ResumePlan]:
    """For each run with tainted checkpoints, the newest untainted one whose files verify."""
    bad = {(c.run, c.step) for c in tainted}
    plans = []
    for run in sorted({c.run for c in tainted}):
        candidates = [c for c in reversed(index.of_run(run)) if (c.run, c.step) not in bad and not c.tainted]
        chosen = None
        for candidate in candidates:
            try:
                verify_checkpoint(Path(candidate.checkpoint))
                chosen = candidate
                break
            except CheckpointError as exc:
                warn(f"rollback: cannot resume from {candidate.name}: {exc}")
        if chosen is None:
            warn(f"rollback: run {run!r} has no untainted checkpoint on this machine; start it again on main")
            continue
        # the run's latest config (the tainted checkpoints' one): the resumed run goes as far
        config = training_config(index.of_run(run)[-1])
        new_run = f"{run}-{restored.tag}"
        run_dir = Path(chosen.checkpoint).parent.parent.parent / new_run
        config |= {"run": new_run, "commit": restored.head, "resume": "allow-data-change",
                   "home": str(run_dir.parent.parent), "steps": steps or config["steps"]}  # fmt: skip
        plans.append(ResumePlan(chosen, new_run, run_dir, config))
    return plans


def fork_checkpoint(repo: DataRepo, plan: ResumePlan, rollback_tag: str, flow_run_id: str) -> Path:
    """Put the chosen checkpoint into the new run's directory and record the fork on ``runs``."""
    source = Path(plan.from_checkpoint.checkpoint)
    destination = plan.run_dir / "checkpoints" / step_dir_name(plan.from_checkpoint.step)
    if not destination.exists():
        destination.parent.mkdir(parents=True, exist_ok=True)
        tmp = destination.with_name(f".tmp-{destination.name}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(source, tmp, copy_function=_link_or_copy)  # files never change after a save
        os.rename(tmp, destination)
    fork = {
        "from_run": plan.from_checkpoint.run,
        "from_step": plan.from_checkpoint.step,
        "from_checkpoint": str(source),
        "data_commit": plan.from_checkpoint.data_commit,
        "resume_on": plan.config["commit"],
        "rollback": rollback_tag,
        "flow_run_id": flow_run_id,
        "run": plan.run,
    }
    ensure_runs_branch(repo)
    step = plan.from_checkpoint.step
    record = {**plan.from_checkpoint.record, "run": plan.run, "checkpoint": str(destination), "forked_from": fork}
    put_record(repo, checkpoint_record_path(plan.run, step), record)
    put_record(repo, event_record_path(plan.run, "fork", step), {**fork, "step": step})
    repo.commit(
        LINEAGE_BRANCH,
        f"lineage: run {plan.run} forked from {plan.from_checkpoint.name} after {rollback_tag}",
        {"kind": "lineage", "run": plan.run, "rollback": rollback_tag},
    )
    return destination


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)
