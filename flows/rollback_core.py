"""The pure core of a rollback (no Prefect): plan, restore ``main``, taint, fork a run to resume.

:mod:`flows.rollback` is the flow around it; its docstring says what a rollback does and
defines which checkpoints are tainted.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import deque
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flows.lineage import (
    CheckpointRecord,
    LineageIndex,
    TaintMark,
    rollback_record_path,
    taint_record_path,
    training_config,
)
from flows.wap import MAIN, PublishBusy, publish_in_progress, publish_lock, tags_of
from tasks.io import tokenlake_version
from training.checkpoint import CheckpointError, step_dir_name, verify_checkpoint
from training.lineage import LINEAGE_BRANCH, checkpoint_record_path, event_record_path
from versioning import Conflict, DataRepo, MergeConflict, NoChanges, NotFound, RepoError

ROLLBACK_TAG_PREFIX = "rollback-"


class RollbackRefused(ValueError):
    """A rollback that must not run; the message says why and what to do instead."""


@dataclass(frozen=True)
class RollbackPlan:
    """What a rollback will do, decided from one read of ``main``'s history."""

    target_ref: str
    target: str  # commit id
    main_head: str
    to_revert: tuple[str, ...]  # first-parent commits newer than the target, newest first
    main_history: frozenset[str]  # every commit reachable from main's head
    off_main: frozenset[str]  # ... but not from the target: the data that leaves main
    hard: bool


@dataclass(frozen=True)
class RestoredMain:
    tag: str
    method: str  # "revert", "revert+restore", "restore" or "hard-reset"
    previous_head: str
    head: str  # main's head after the rollback
    reverted: tuple[str, ...]  # the commits whose revert is on main now
    revert_commits: tuple[str, ...]
    restore_commit: str  # "" when the reverts alone reached the target
    new_commits: frozenset[str]  # commits the rollback added to main


def plan_rollback(repo: DataRepo, to: str, hard: bool = False) -> RollbackPlan:
    """Check that a rollback of ``main`` to ``to`` may run, and decide its commits."""
    refuse_while_publishing(repo)
    try:
        target = repo.resolve(to)
    except NotFound:
        raise RollbackRefused(
            f"{to!r} is not a tag, branch or commit of this repository; see `tokenlake datasets`"
        ) from None
    main_head = repo.resolve(MAIN)
    if not repo.is_ancestor(target, main_head):
        raise RollbackRefused(
            f"{to!r} ({target[:12]}) is not an ancestor of main, so main was never at that version; "
            "roll back to a tag or commit listed by `tokenlake repo log main`"
        )
    if not repo.diff(target, main_head):
        raise RollbackRefused(f"main already holds the content of {to!r} ({target[:12]}): nothing to roll back")
    parents = {c.id: c.parents for c in repo.log(main_head)}
    history = _ancestors(parents, main_head)
    return RollbackPlan(
        target_ref=to,
        target=target,
        main_head=main_head,
        to_revert=_revertible_chain(parents, main_head, target),
        main_history=frozenset(history),
        off_main=frozenset(history - _ancestors(parents, target)),
        hard=hard,
    )


def refuse_while_publishing(repo: DataRepo) -> None:
    holder = publish_in_progress(repo)
    if holder is not None:
        raise RollbackRefused(
            f"a curate run is publishing (the publish lock is held by flow run {holder['flow_run_id'] or 'unknown'}); "
            "wait for it to finish, or run `tokenlake janitor` if that run is dead, then roll back"
        )


def _ancestors(parents: dict[str, tuple[str, ...]], head: str) -> set[str]:
    seen, todo = {head}, deque([head])
    while todo:
        for parent in parents.get(todo.popleft(), ()):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


def _revertible_chain(parents: dict[str, tuple[str, ...]], head: str, target: str) -> tuple[str, ...]:
    """First-parent commits newer than ``target`` whose first parent still descends from it.

    Reverting a commit against its first parent keeps the target's content only while that
    parent descends from the target; a merge that brought the target in through its second
    parent ends the chain (a restore commit covers the rest)."""
    children: dict[str, list[str]] = {}
    for commit_id, commit_parents in parents.items():
        for parent in commit_parents:
            children.setdefault(parent, []).append(commit_id)
    descends, todo = {target}, deque([target])
    while todo:
        for child in children.get(todo.popleft(), ()):
            if child not in descends:
                descends.add(child)
                todo.append(child)
    chain, current = [], head
    while current != target and parents.get(current) and parents[current][0] in descends:
        chain.append(current)
        current = parents[current][0]
    return tuple(chain)


def restore_main(repo: DataRepo, plan: RollbackPlan, flow_run_id: str) -> RestoredMain:
    """Bring ``main`` to the target's content (under the publish lock) and tag the rollback."""
    try:
        with publish_lock(repo, flow_run_id, wait_s=0):  # the janitor frees it if this process dies
            if repo.resolve(MAIN) != plan.main_head:
                raise RollbackRefused("main moved while the rollback was being planned; run it again")
            tag = next_rollback_tag(repo)
            restored = _hard_reset(repo, plan, tag) if plan.hard else _revert(repo, plan, tag, flow_run_id)
    except PublishBusy:
        refuse_while_publishing(repo)
        raise RollbackRefused("a curate run is publishing; wait for it to finish, then roll back") from None
    leftover = repo.diff(plan.target, MAIN)
    if leftover:
        raise RepoError(
            f"rollback {tag} left main differing from {plan.target[:12]} in {len(leftover)} path(s), "
            f"e.g. {leftover[0].path}; inspect with `tokenlake repo diff {plan.target[:12]} main`"
        )
    return restored


def _metadata(plan: RollbackPlan, tag: str, flow_run_id: str, stage: str, **extra: str) -> dict[str, str]:
    return {
        "stage": stage,
        "rollback": tag,
        "target": plan.target,
        "target_ref": plan.target_ref,
        "input_commit": plan.main_head,
        "flow_run_id": flow_run_id,
        "tokenlake_version": tokenlake_version(),
        **extra,
    }


def _revert(repo: DataRepo, plan: RollbackPlan, tag: str, flow_run_id: str) -> RestoredMain:
    reverted, revert_commits = [], []
    for commit_id in plan.to_revert:
        if not repo.diff(plan.target, MAIN):
            break
        try:
            meta = _metadata(plan, tag, flow_run_id, "revert", reverted_commit=commit_id)
            revert_commits.append(repo.revert(MAIN, commit_id, parent_number=1, metadata=meta).id)
            reverted.append(commit_id)
        except NoChanges:
            continue  # an empty commit (an earlier rollback's marker): nothing to undo
        except (MergeConflict, Conflict):
            break  # later commits touched the same paths: the restore commit writes the rest
    restore_commit = _restore_commit(repo, plan, tag, flow_run_id)
    method = "revert" if not restore_commit else "revert+restore" if reverted else "restore"
    record = _metadata(
        plan, tag, flow_run_id, "rollback", method=method,
        reverted=json.dumps(reverted), restore_commit=restore_commit,
    )  # fmt: skip
    message = f"rollback main to {plan.target_ref} ({plan.target[:12]}): " + (
        f"reverted {len(reverted)} commit(s)" + (" and restored the rest" if restore_commit else "")
    )
    head = repo.commit(MAIN, message, record, allow_empty=True).id
    repo.create_tag(tag, head)
    new = {*revert_commits, head, *([restore_commit] if restore_commit else [])}
    return RestoredMain(
        tag, method, plan.main_head, head, tuple(reverted), tuple(revert_commits), restore_commit, frozenset(new)
    )


def _restore_commit(repo: DataRepo, plan: RollbackPlan, tag: str, flow_run_id: str) -> str:
    """One commit that makes main's tree equal the target's; "" when it already does."""
    changes = repo.diff(MAIN, plan.target)
    if not changes:
        return ""
    repo.discard_uncommitted(MAIN)
    for change in changes:
        if change.kind == "removed":
            repo.delete(MAIN, change.path)
        else:
            with repo.open(plan.target, change.path) as reader:
                repo.put(MAIN, change.path, reader)
    meta = _metadata(plan, tag, flow_run_id, "restore", paths=str(len(changes)))
    return repo.commit(MAIN, f"restore {len(changes)} path(s) to {plan.target_ref}", meta).id


def _hard_reset(repo: DataRepo, plan: RollbackPlan, tag: str) -> RestoredMain:
    repo.discard_uncommitted(MAIN)  # a hard reset keeps uncommitted changes, as in lakeFS
    repo.reset_hard(MAIN, plan.target)
    repo.create_tag(tag, plan.target)
    return RestoredMain(tag, "hard-reset", plan.main_head, plan.target, (), (), "", frozenset())


def next_rollback_tag(repo: DataRepo, now: datetime | None = None) -> str:
    prefix = f"{ROLLBACK_TAG_PREFIX}{(now or datetime.now(UTC)).strftime('%Y%m%d')}-"
    taken = [int(t[len(prefix):]) for t in repo.list_tags() if t.startswith(prefix) and t[len(prefix):].isdigit()]
    return f"{prefix}{max(taken, default=0) + 1}"


# ---- tainted checkpoints -----------------------------------------------------------------


def tainted_commits(repo: DataRepo, plan: RollbackPlan, restored: RestoredMain, commits: set[str]) -> set[str]:
    """Which of ``commits`` (data commits of checkpoints) hold data that left main (module docstring)."""
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
        put_json(repo, taint_record_path(checkpoint.run, checkpoint.step), {"marks": marks})
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
    put_json(repo, rollback_record_path(restored.tag), record)
    meta = {"kind": "rollback", "rollback": restored.tag, "flow_run_id": flow_run_id}
    message = f"rollback {restored.tag}: {len(tainted)} checkpoint(s) tainted"
    return repo.commit(LINEAGE_BRANCH, message, meta, allow_empty=True).id


def put_json(repo: DataRepo, path: str, obj: Any) -> None:
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
    put_json(repo, checkpoint_record_path(plan.run, step), record)
    put_json(repo, event_record_path(plan.run, "fork", step), {**fork, "step": step})
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
