"""Restoring ``main`` to an earlier dataset version, without Prefect: plan, revert or restore, tag.

Steps 1 and 2 of a rollback; :mod:`flows.rollback` is the flow around it, and its docstring
says what a rollback does. :mod:`flows.taint` is the training side (steps 3 and 4).
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime

from flows.refusals import Refusal
from flows.wap import PublishBusy, publish_in_progress, publish_lock
from formats.layout import MAIN, RESTORE_STAGE, REVERT_STAGE, ROLLBACK_STAGE, ROLLBACK_TAG_PREFIX
from formats.rollbacks import HARD_RESET
from tasks.stage import tokenlake_version
from versioning import Conflict, DataRepo, MergeConflict, NoChanges, NotFound, RepoError


@Refusal.register
class RollbackRefused(ValueError):
    """A rollback that must not run; the message says why and what to do instead."""


class AlreadyRestored(RollbackRefused):
    """``main`` already holds the target's content: there is nothing to restore.

    Running the rollback again may still have checkpoints to mark (``flows.taint.plan_or_marks``)."""


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
        raise AlreadyRestored(
            f"main already holds the content of {to!r} ({target[:12]}): nothing to roll back"
        )
    parents = {c.id: c.parents for c in repo.log(main_head)}
    history = _reachable(parents, main_head)
    return RollbackPlan(
        target_ref=to,
        target=target,
        main_head=main_head,
        to_revert=_revertible_chain(parents, main_head, target),
        main_history=frozenset(history),
        off_main=frozenset(history - _reachable(parents, target)),
        hard=hard,
    )


def refuse_while_publishing(repo: DataRepo) -> None:
    holder = publish_in_progress(repo)
    if holder is not None:
        raise RollbackRefused(
            f"a curate run is publishing (the publish lock is held by flow run {holder['flow_run_id'] or 'unknown'}); "
            "wait for it to finish, or run `tokenlake janitor` if that run is dead, then roll back"
        )


def _reachable(edges: dict[str, list[str]] | dict[str, tuple[str, ...]], start: str) -> set[str]:
    """``start`` and every commit reachable from it along ``edges`` (parents, or children)."""
    seen, todo = {start}, deque([start])
    while todo:
        for following in edges.get(todo.popleft(), ()):
            if following not in seen:
                seen.add(following)
                todo.append(following)
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
    descends = _reachable(children, target)
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
            meta = _metadata(plan, tag, flow_run_id, REVERT_STAGE, reverted_commit=commit_id)
            revert_commits.append(repo.revert(MAIN, commit_id, parent_number=1, metadata=meta).id)
            reverted.append(commit_id)
        except NoChanges:
            continue  # an empty commit (an earlier rollback's marker): nothing to undo
        except (MergeConflict, Conflict):
            break  # later commits touched the same paths: the restore commit writes the rest
    restore_commit = _restore_commit(repo, plan, tag, flow_run_id)
    method = "revert" if not restore_commit else "revert+restore" if reverted else "restore"
    record = _metadata(
        plan, tag, flow_run_id, ROLLBACK_STAGE, method=method,
        reverted=json.dumps(reverted), restore_commit=restore_commit,
    )  # fmt: skip
    message = f"rollback main to {plan.target_ref} ({plan.target[:12]}): " + (
        f"reverted {len(reverted)} commit(s)" + (" and restored the rest" if restore_commit else "")
    )
    head = repo.commit(MAIN, message, record, allow_empty=True).id
    repo.create_tag(tag, head)
    new = {*revert_commits, head, *([restore_commit] if restore_commit else [])}
    return RestoredMain(
        tag,
        method,
        plan.main_head,
        head,
        tuple(reverted),
        tuple(revert_commits),
        restore_commit,
        frozenset(new),
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
    meta = _metadata(plan, tag, flow_run_id, RESTORE_STAGE, paths=str(len(changes)))
    return repo.commit(MAIN, f"restore {len(changes)} path(s) to {plan.target_ref}", meta).id


def _hard_reset(repo: DataRepo, plan: RollbackPlan, tag: str) -> RestoredMain:
    repo.discard_uncommitted(MAIN)  # a hard reset keeps uncommitted changes, as in lakeFS
    repo.reset_hard(MAIN, plan.target)
    repo.create_tag(tag, plan.target)
    return RestoredMain(tag, HARD_RESET, plan.main_head, plan.target, (), (), "", frozenset())


def next_rollback_tag(repo: DataRepo, now: datetime | None = None) -> str:
    prefix = f"{ROLLBACK_TAG_PREFIX}{(now or datetime.now(UTC)).strftime('%Y%m%d')}-"
    taken = [
        int(t[len(prefix) :]) for t in repo.list_tags() if t.startswith(prefix) and t[len(prefix) :].isdigit()
    ]
    return f"{prefix}{max(taken, default=0) + 1}"
