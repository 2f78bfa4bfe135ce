"""Which data commits a rollback of ``main`` reverted: the rollback records and the one rule
shared by the trainer, ``tokenlake lineage``, ``tokenlake rollback`` and the curate flow.

A rollback (``flows/restore.py``) gives ``main`` an earlier version's content back through
revert commits. The reverted commits therefore stay in ``main``'s history, so "not an ancestor
of main" cannot tell bad data from good. The rollbacks themselves are the record:

* ``runs/_rollbacks/<tag>.json`` on branch ``runs`` (:class:`RollbackRecord`, written by the
  rollback flow);
* for a rollback whose record was never written (its process died after tagging main), the
  tagged ``rollback`` commit on ``main``. Its metadata names the target and main's previous
  head. A hard reset leaves no such commit, so only its record knows about it.

The rule, for a data commit ``c``:

1. A commit that a rollback wrote (``rollback``, ``restore``, ``revert``) is judged as the
   commit whose content it holds: the target, or for a revert the reverted commit's first
   parent.
2. Rollback ``R`` *takes* ``c`` off main in either of two cases. In the first, ``c`` was on
   main's history before ``R`` and is not reachable from ``R``'s target. In the second, ``c``
   descends from such a commit and contains none of the commits ``R`` added. That covers a
   branch built on the bad version, whether it was committed before or after ``R``.
   Anything built on main after ``R`` contains ``R``'s commits, so it is not taken.
3. A later rollback *restores* ``c`` when ``c`` is reachable from its target and that target
   contains none of the commits of the rollback that took ``c``: it rolled back to a point
   before that rollback.
4. ``c`` is *reverted* when the last rollback that takes or restores it, in order, takes it.
   The exception is a version published on ``main`` after that rollback, and not taken off
   since, that holds exactly ``c``'s content (``diff`` is empty). Such a re-publish makes
   ``c`` good again.

So the verdict depends on the data commit and the recorded rollbacks, never on when a
checkpoint was saved or when its lineage record reached the repository. It is a fact about
dataset versions, so it lives below the flows and the trainer, which both import it; the
trainer keeps only its refusal (``training/reverted.py``).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from formats import layout
from formats.layout import (
    DATASET_TAG_PREFIX,
    LINEAGE_BRANCH,
    MAIN,
    PUBLISH_STAGE,
    RESTORE_STAGE,
    REVERT_STAGE,
    ROLLBACK_STAGE,
    ROLLBACK_TAG_PREFIX,
)
from versioning import Commit, DataRepo, NotFound

HARD_RESET = "hard-reset"  # the method of a rollback that moved main instead of reverting
_CONTENT_DEPTH = 16  # rollback commits restoring rollback commits: a longer chain is a loop


@dataclass(frozen=True)
class RollbackRecord:
    """One rollback of ``main``, as ``runs/_rollbacks/<tag>.json`` holds it."""

    tag: str
    target: str  # the commit main's content was restored to
    previous_main: str  # main's head before the rollback
    main: str  # main's head after it: the tagged rollback commit (for a hard reset, the target)
    method: str  # "revert", "revert+restore", "restore" or "hard-reset"
    off_main: frozenset[str]  # reachable from previous_main, not from target: the data that left main
    revert_commits: tuple[str, ...] = ()
    restore_commit: str = ""
    reverted: tuple[str, ...] = ()  # the commits whose revert is on main
    target_ref: str = ""  # the target as the user named it
    target_tags: tuple[str, ...] = ()
    tainted: tuple[str, ...] = ()  # RUN@STEP of the checkpoints this rollback marked
    created: float = 0.0
    flow_run_id: str = ""

    @property
    def own_commits(self) -> frozenset[str]:
        """The commits this rollback added to main (none for a hard reset)."""
        if self.method == HARD_RESET:
            return frozenset()
        return frozenset(
            {self.main, *self.revert_commits, *([self.restore_commit] if self.restore_commit else [])}
        )

    @property
    def restored_to(self) -> str:
        return self.target_ref or ", ".join(self.target_tags) or self.target[:12]

    def to_dict(self) -> dict[str, Any]:
        return {
            "tag": self.tag,
            "created": self.created,
            "target": self.target,
            "target_ref": self.target_ref,
            "target_tags": list(self.target_tags),
            "previous_main": self.previous_main,
            "main": self.main,
            "method": self.method,
            "reverted": list(self.reverted),
            "revert_commits": list(self.revert_commits),
            "restore_commit": self.restore_commit,
            "off_main": sorted(self.off_main),
            "tainted": list(self.tainted),
            "flow_run_id": self.flow_run_id,
        }

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> RollbackRecord:
        return cls(
            tag=str(record["tag"]),
            target=str(record.get("target", "")),
            previous_main=str(record.get("previous_main", "")),
            main=str(record.get("main", "")),
            method=str(record.get("method", "")),
            off_main=frozenset(record.get("off_main", ())),
            revert_commits=tuple(record.get("revert_commits", ())),
            restore_commit=str(record.get("restore_commit", "")),
            reverted=tuple(record.get("reverted", ())),
            target_ref=str(record.get("target_ref", "")),
            target_tags=tuple(record.get("target_tags", ())),
            tainted=tuple(record.get("tainted", ())),
            created=float(record.get("created", 0.0)),
            flow_run_id=str(record.get("flow_run_id", "")),
        )


@dataclass(frozen=True)
class Reverted:
    """The verdict on a reverted data commit: the rollback that took its data off main."""

    data_commit: str
    rollback: str  # that rollback's tag
    target: str  # the commit main was restored to
    restored_to: str  # ... as the rollback named it

    @property
    def reason(self) -> str:
        return (
            f"data commit {self.data_commit[:12]} holds data that {self.rollback} took off main "
            f"(main restored to {self.restored_to})"
        )

    def to_dict(self) -> dict[str, str]:
        return {"data_commit": self.data_commit, "rollback": self.rollback, "target": self.target,
                "restored_to": self.restored_to, "reason": self.reason}  # fmt: skip


def restored_from(repo: DataRepo, metadata: dict[str, str]) -> str:
    """For a rollback's own commits, the commit whose content this one holds ("" for any other commit).

    The rollback commit and a restore commit hold the target's content. A revert commit
    holds the first parent of the commit it reverted: one step of several, perhaps."""
    stage = metadata.get("stage")
    if stage in (ROLLBACK_STAGE, RESTORE_STAGE):
        return metadata.get("target", "")
    if stage == REVERT_STAGE and metadata.get("reverted_commit"):
        parents = repo.get_commit(metadata["reverted_commit"]).parents
        return parents[0] if parents else ""
    return ""


class RecordedRollbacks:
    """The rollbacks of ``main`` that a repository records, and the verdict (the module's rule) on data commits."""

    def __init__(self, repo: DataRepo, records: Iterable[RollbackRecord], tags: dict[str, str] | None = None):
        self.repo = repo
        self.records = sorted(records, key=lambda r: (r.created, r.tag))
        self._tags = tags
        self._commits: dict[str, Commit] = {}
        self._main_history: frozenset[str] | None = None
        self._histories: dict[str, frozenset[str]] = {}
        self._verdicts: dict[str, Reverted | None] = {}

    @classmethod
    def read(cls, repo: DataRepo, recorded: Iterable[dict[str, Any]] | None = None) -> RecordedRollbacks:
        """Every rollback: the records on ``runs`` and the rollback tags of main that have none.

        ``recorded``: the records, when the caller has already read them from ``runs``."""
        records = {
            r.tag: r
            for r in map(RollbackRecord.from_dict, read_records(repo) if recorded is None else recorded)
        }
        rollbacks = cls(repo, records.values(), repo.list_tags())
        unrecorded = [
            found
            for tag, commit_id in sorted(rollbacks.tags.items())
            if tag.startswith(ROLLBACK_TAG_PREFIX) and tag not in records
            if (found := rollbacks._from_tagged_commit(tag, commit_id)) is not None
        ]
        return rollbacks.including(*unrecorded) if unrecorded else rollbacks

    def including(self, *records: RollbackRecord) -> RecordedRollbacks:
        """These rollbacks and ``records`` (a rollback whose record is not written yet)."""
        return RecordedRollbacks(self.repo, [*self.records, *records], self._tags)

    @property
    def tags(self) -> dict[str, str]:
        if self._tags is None:
            self._tags = self.repo.list_tags()
        return self._tags

    # ---- the verdict ---------------------------------------------------------------------

    def verdict(self, commit_id: str) -> Reverted | None:
        """Why the data of ``commit_id`` is reverted, or None when it is not (or the repository lacks it)."""
        if not self.records:
            return None
        if commit_id not in self._verdicts:
            self._verdicts[commit_id] = self._judge(commit_id)
        return self._verdicts[commit_id]

    def verdicts(self, commit_ids: Iterable[str]) -> dict[str, Reverted]:
        """The reverted ones among ``commit_ids``."""
        judged = {c: self.verdict(c) for c in set(commit_ids) if c}
        return {c: v for c, v in judged.items() if v is not None}

    def _judge(self, commit_id: str) -> Reverted | None:
        try:
            content = self._content_of(commit_id)
            history = self._history(content)
        except NotFound:
            return None  # a commit this repository does not have: nothing to say about it
        taken_by: RollbackRecord | None = None
        for record in self.records:
            if self._takes(record, content, history):
                taken_by = record
            elif taken_by is not None and self._restores(record, content, taken_by):
                taken_by = None
        if taken_by is None or self._republished(content, taken_by):
            return None
        return Reverted(commit_id, taken_by.tag, taken_by.target, taken_by.restored_to)

    @staticmethod
    def _takes(record: RollbackRecord, content: str, history: frozenset[str]) -> bool:
        if content in record.off_main:
            return True
        return bool(history & record.off_main) and not history & record.own_commits

    def _restores(self, record: RollbackRecord, content: str, taken_by: RollbackRecord) -> bool:
        try:
            target_history = self._history(self._content_of(record.target))
        except NotFound:
            return False
        return content in target_history and not target_history & taken_by.own_commits

    def _republished(self, content: str, taken_by: RollbackRecord) -> bool:
        """A version published on main after ``taken_by``, and not taken off since, holds exactly ``content``."""
        later = self._main_descendants(taken_by.main) - {taken_by.main}
        gone = frozenset().union(*(r.off_main for r in self.records))
        published = [
            c for c in sorted(later - gone) if self._commits[c].metadata.get("stage") == PUBLISH_STAGE
        ]
        return any(not self.repo.diff(content, candidate) for candidate in published)

    # ---- what main holds, for a refusal ---------------------------------------------------

    def main_holds(self) -> str:
        """The version main holds now, by its dataset tag when it has one."""
        head = self.repo.resolve(MAIN)
        content = self._content_of(head)
        return self.dataset_name(content)

    def dataset_name(self, commit_id: str) -> str:
        tags = sorted(t for t, c in self.tags.items() if c == commit_id and t.startswith(DATASET_TAG_PREFIX))
        return f"{tags[-1]} ({commit_id[:12]})" if tags else commit_id[:12]

    # ---- the commit graph, read once ------------------------------------------------------

    def _commit(self, commit_id: str) -> Commit:
        if commit_id not in self._commits:
            self._load_main()
        if commit_id not in self._commits:
            for commit in self.repo.log(commit_id):  # NotFound for a commit the repository lacks
                self._commits.setdefault(commit.id, commit)
        if commit_id not in self._commits:
            raise NotFound(f"commit {commit_id} not found")
        return self._commits[commit_id]

    def _load_main(self) -> frozenset[str]:
        if self._main_history is None:
            ids = []
            for commit in self.repo.log(MAIN):
                self._commits.setdefault(commit.id, commit)
                ids.append(commit.id)
            self._main_history = frozenset(ids)
        return self._main_history

    def _history(self, commit_id: str) -> frozenset[str]:
        """``commit_id`` and every commit reachable from it."""
        if commit_id not in self._histories:
            self._commit(commit_id)  # loads its ancestry
            self._histories[commit_id] = frozenset(_reachable(commit_id, lambda c: self._commits[c].parents))
        return self._histories[commit_id]

    def _main_descendants(self, commit_id: str) -> frozenset[str]:
        """The commits of main's history that descend from ``commit_id`` (itself included)."""
        on_main = self._load_main()
        children: dict[str, list[str]] = {}
        for child in on_main:
            for parent in self._commits[child].parents:
                children.setdefault(parent, []).append(child)
        return frozenset(_reachable(commit_id, lambda c: children.get(c, ()))) & on_main

    def _content_of(self, commit_id: str) -> str:
        """The commit whose content ``commit_id`` holds: itself, or what the rollback that wrote it restored."""
        for _ in range(_CONTENT_DEPTH):
            source = restored_from(self.repo, self._commit(commit_id).metadata)
            if not source:
                return commit_id
            commit_id = source
        return commit_id

    def _from_tagged_commit(self, tag: str, commit_id: str) -> RollbackRecord | None:
        """A rollback's record rebuilt from its tagged commit on main (None for a hard reset's tag)."""
        try:
            commit = self._commit(commit_id)
        except NotFound:
            return None
        meta = commit.metadata
        if meta.get("stage") != ROLLBACK_STAGE or meta.get("rollback") != tag or not meta.get("input_commit"):
            return None
        previous, target = meta["input_commit"], meta.get("target", "")
        try:
            off_main = self._history(previous) - self._history(target)
        except NotFound:
            return None
        reverts = []
        walk = commit
        while walk.parents:  # the rollback's commits sit just below it on main's first-parent line
            walk = self._commit(walk.parents[0])
            if walk.metadata.get("rollback") != tag:
                break
            if walk.metadata.get("stage") == REVERT_STAGE:
                reverts.append(walk.id)
        return RollbackRecord(
            tag=tag, target=target, previous_main=previous, main=commit.id, method=meta.get("method", ""),
            off_main=frozenset(off_main), revert_commits=tuple(reversed(reverts)),
            restore_commit=meta.get("restore_commit", ""), reverted=tuple(json.loads(meta.get("reverted") or "[]")),
            target_ref=meta.get("target_ref", ""), created=commit.created, flow_run_id=meta.get("flow_run_id", ""),
        )  # fmt: skip


def read_records(repo: DataRepo) -> list[dict[str, Any]]:
    """The rollback records on branch ``runs`` (none when the branch does not exist yet)."""
    try:
        head = repo.resolve(LINEAGE_BRANCH)
    except NotFound:
        return []
    paths = [
        s.path for s in repo.list(head, f"{layout.ROLLBACK_RECORDS}/") if layout.ROLLBACK_RECORD.match(s.path)
    ]
    return [json.loads(repo.get(head, path)) for path in paths]


def _reachable(start: str, following: Any) -> Iterator[str]:
    """``start`` and everything reachable from it along ``following(commit) -> commits``."""
    seen, todo = {start}, deque([start])
    yield start
    while todo:
        for after in following(todo.popleft()):
            if after not in seen:
                seen.add(after)
                todo.append(after)
                yield after
