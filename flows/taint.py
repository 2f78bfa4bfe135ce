"""The training side of a rollback, without Prefect: mark checkpoints trained on data that left
``main`` (never delete them), and fork a run's newest clean checkpoint to resume on the restored
version.

Steps 3 and 4 of a rollback; :mod:`flows.rollback` is the flow around it, and
:mod:`formats.rollbacks` decides which data is reverted (so which checkpoints are tainted).
:mod:`flows.restore` restores ``main`` (steps 1 and 2).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from flows.lineage import CheckpointRecord, LineageIndex, TaintMark, read_lineage, training_config
from flows.restore import AlreadyRestored, RestoredMain, RollbackPlan, plan_rollback
from flows.wap import tags_of
from formats.layout import (
    LINEAGE_BRANCH,
    MAIN,
    checkpoint_record_path,
    event_record_path,
    rollback_record_path,
    taint_record_path,
)
from formats.rollbacks import RecordedRollbacks, RollbackRecord
from training.checkpoint import CheckpointError, step_dir_name, verify_checkpoint
from versioning import Conflict, DataRepo


def rollback_record(
    repo: DataRepo, plan: RollbackPlan, restored: RestoredMain, flow_run_id: str
) -> RollbackRecord:
    """The record of a rollback that just restored main (written by :func:`mark_tainted`)."""
    return RollbackRecord(
        tag=restored.tag, target=plan.target, previous_main=restored.previous_head, main=restored.head,
        method=restored.method, off_main=plan.off_main, revert_commits=restored.revert_commits,
        restore_commit=restored.restore_commit, reverted=restored.reverted, target_ref=plan.target_ref,
        target_tags=tuple(tags_of(repo, plan.target)), created=time.time(), flow_run_id=flow_run_id,
    )  # fmt: skip


def find_tainted(
    repo: DataRepo, index: LineageIndex, rollback: RollbackRecord | None = None
) -> list[CheckpointRecord]:
    """Checkpoints trained on reverted data that no mark of the rollback which reverted it names yet.

    The verdict is :mod:`formats.rollbacks`'s, over every recorded rollback plus ``rollback`` (one
    that just ran, whose record is not written yet). So a checkpoint saved after an earlier
    rollback, or whose lineage record arrived late, is found as well as those the new rollback
    takes off main."""
    history = index.history or RecordedRollbacks.read(repo, index.rollbacks)
    if rollback is not None:
        history = history.including(rollback)
    verdicts = history.verdicts(c.data_commit for c in index.checkpoints)
    judged = [replace(c, reverted=verdicts.get(c.data_commit)) for c in index.checkpoints]
    return [c for c in judged if c.tainted and not c.marked]


def mark_tainted(
    repo: DataRepo, tainted: list[CheckpointRecord], rollback: RollbackRecord | None, flow_run_id: str
) -> str:
    """One commit on ``runs``: a mark per checkpoint, by the rollback that reverted its data, and
    ``rollback``'s record when one ran; returns the commit's id. Marks are only ever added."""
    ensure_runs_branch(repo)
    now = time.time()
    for checkpoint in tainted:
        verdict = checkpoint.reverted
        assert verdict is not None, "find_tainted() gives tainted checkpoints only"
        mark = TaintMark(
            verdict.rollback, verdict.target, checkpoint.data_commit, verdict.reason, marked_at=now
        )
        marks = [asdict(m) for m in checkpoint.taints if m.rollback != verdict.rollback] + [asdict(mark)]
        put_record(repo, taint_record_path(checkpoint.run, checkpoint.step), {"marks": marks})
    if rollback is not None:
        named = tuple(c.name for c in tainted if c.reverted and c.reverted.rollback == rollback.tag)
        put_record(repo, rollback_record_path(rollback.tag), replace(rollback, tainted=named).to_dict())
        message = f"rollback {rollback.tag}: {len(tainted)} checkpoint(s) tainted"
        meta = {"kind": "rollback", "rollback": rollback.tag, "flow_run_id": flow_run_id}
    else:
        by = sorted({c.reverted.rollback for c in tainted if c.reverted})
        message = f"taint: {len(tainted)} checkpoint(s) trained on data reverted by {', '.join(by)}"
        meta = {"kind": "taint", "rollback": ",".join(by), "flow_run_id": flow_run_id}
    return repo.commit(LINEAGE_BRANCH, message, meta, allow_empty=True).id


def plan_or_marks(repo: DataRepo, to: str, hard: bool = False) -> RollbackPlan | None:
    """The rollback's plan, or None when ``main`` already holds ``to``'s content but checkpoints
    trained on data an earlier rollback reverted still lack their mark: running the rollback
    again then marks them. Otherwise it refuses as :func:`flows.restore.plan_rollback` does."""
    try:
        return plan_rollback(repo, to, hard)
    except AlreadyRestored as already:
        if find_tainted(repo, read_lineage(repo)):
            return None
        raise AlreadyRestored(f"{already}, and every checkpoint trained on reverted data is marked") from None


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
    record = {
        **plan.from_checkpoint.record,
        "run": plan.run,
        "checkpoint": str(destination),
        "forked_from": fork,
    }
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
