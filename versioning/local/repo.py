"""LocalRepo: the embedded DataRepo adapter (a directory, SQLite and content-addressed files).

Layout of ``root``::

    repo.db            SQLite (WAL): meta, commits, tree_entries, branches, tags, staging
    objects/ab/cdef..  object bytes, named by their sha256; read-only files
    objects/tmp/       temp files of writes in progress (swept by ensure())

Semantics follow lakeFS v1.84.0 (see versioning.port and docs/versioning.md):

* reads of a branch see its staged changes; ``diff``, ``log``, ``merge`` and ``revert``
  work on commits, so a branch there means its head commit (staged changes ignored);
* a staged entry equal to the committed one (same sha256 and size) is no change: it
  neither makes a commit nor a dirty branch, and committing keeps the committed entry;
* ``merge`` of a source with no changes since the merge base raises NoChanges;
  otherwise it always records a merge commit (no fast-forward), parents
  (destination head, source commit);
* ``revert`` that would change nothing raises NoChanges; one whose paths were changed
  again since raises Conflict naming them;
* ``reset_hard`` moves the head and keeps the staged changes;
* the default branch cannot be deleted;
* branches, tags and commit ids share one namespace; a ref resolves as a full commit id,
  then a branch, then a tag, then a unique commit id prefix, and takes lakeFS's
  modifiers: ``~N`` (N first parents up), ``^N`` (parent N), ``@`` (a branch's committed
  state, without its staged changes).

The lakeFS merge-commit metadata key ``.lakefs.merge.strategy`` is not added here: the
port keeps lakeFS's ``.lakefs.`` keys out of what it returns (the API double adds it).

Garbage collection is not implemented: objects of deleted branches and orphan objects
of interrupted writes stay on disk (never visible through the port).
"""

from __future__ import annotations

import functools
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from versioning.diskspace import DiskFull
from versioning.local import graph, trees
from versioning.local.actions import MergeEvent, check_pre_merge
from versioning.local.db import Database
from versioning.local.objects import NEW_REPOSITORY_HASH, ObjectStore
from versioning.port import (
    Change,
    Commit,
    Conflict,
    InvalidPath,
    MergeConflict,
    NoChanges,
    NotFound,
    ObjectStat,
    PutSource,
    RepoError,
    validate_branch,
    validate_key,
    validate_key_prefix,
    validate_metadata,
    validate_repo_name,
    validate_tag,
)

INITIAL_MESSAGE = "Repository created"
# lakeFS's ref grammar (pkg/graveler/ref/parse_ref.go, resolve_ref.go).
_HASH = re.compile(r"^[0-9a-fA-F]{1,64}$")
_FULL_COMMIT_ID = re.compile(r"^[0-9a-fA-F]{64}$")
_REF_PARTS = re.compile(r"(?:^|[~^@$])[^~^@$]*")
_MODIFIER_COUNT = re.compile(r"^[+-]?[0-9]+$")
_GO_SPACE = re.compile(r"[\t\n\f\r ]")


class LocalRepo:
    """A DataRepo in a local directory, safe for many threads and processes at once."""

    def __init__(
        self,
        root: Path | str,
        name: str | None = None,
        *,
        durable: bool = True,
        object_hash: str | None = None,
    ):
        """``durable=False`` skips fsync: still safe against a killed process, not a power loss.
        ``object_hash`` names the objects of a repository that ``ensure()`` creates (default
        :data:`~versioning.local.objects.NEW_REPOSITORY_HASH`); an existing one keeps its own."""
        self._new_object_hash = object_hash or NEW_REPOSITORY_HASH
        self.root = Path(root).expanduser().resolve()
        self.name = validate_repo_name(name) if name is not None else _name_from_directory(self.root)
        self._db = Database(self.root / "repo.db")
        self._durable = durable
        self._store: ObjectStore | None = None  # known once the database says which object hash

    def __repr__(self) -> str:
        return f"LocalRepo({str(self.root)!r}, name={self.name!r})"

    def __reduce__(self) -> tuple:
        """Pickled as its directory, name and durability: a worker process opens it again, once
        (its database connection never travels)."""
        return (_opened_in_this_process, (str(self.root), self.name, self._durable))

    @property
    def object_hash(self) -> str:
        """The hash that names this repository's objects: ``blake3`` (format 2, new repositories)
        or ``sha256`` (repositories made before it); fixed for the repository's life."""
        return self._objects.algorithm

    @property
    def _objects(self) -> ObjectStore:
        if self._store is None:
            algorithm = "sha256"
            if self._db.exists():
                with self._db.read() as conn:
                    row = conn.execute("SELECT value FROM meta WHERE key='object_hash'").fetchone()
                algorithm = row[0] if row else "sha256"
            self._store = ObjectStore(self.root, durable=self._durable, algorithm=algorithm)
        return self._store

    def __enter__(self) -> LocalRepo:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close this thread's database connection (it reopens on next use)."""
        self._db.close()

    def ensure(self, default_branch: str = "main") -> None:
        validate_branch(default_branch)
        if self.root.exists() and not self.root.is_dir():
            raise Conflict(f"repository path {self.root} exists and is not a directory")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RepoError(f"cannot create a repository at {self.root}: {exc.strerror}") from exc
        self._db.create_schema()
        with self._db.write() as conn:
            if conn.execute("SELECT 1 FROM meta WHERE key='default_branch'").fetchone() is None:
                row = _new_commit(conn, trees.EMPTY_TREE, (), INITIAL_MESSAGE, {})
                conn.execute("INSERT INTO branches(name, head) VALUES (?, ?)", (default_branch, row.id))
                conn.execute("INSERT INTO meta(key, value) VALUES ('default_branch', ?)", (default_branch,))
                conn.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('name', ?)", (self.name,))
                conn.execute(
                    "INSERT OR IGNORE INTO meta(key, value) VALUES ('object_hash', ?)",
                    (self._new_object_hash,),
                )
        self._store = None  # the object hash is recorded now
        try:
            self._objects.create()
        except OSError as exc:
            raise RepoError(f"cannot create a repository at {self.root}: {exc.strerror}") from exc
        self._objects.sweep_temp_files()

    # refs

    def resolve(self, ref: str) -> str:
        with self._db.read() as conn:
            return self._resolve(conn, ref)

    def create_branch(self, name: str, source: str = "main") -> str:
        validate_branch(name)
        with self._db.write() as conn:
            # lakeFS's order (pkg/catalog/catalog.go, pkg/graveler/graveler.go): the shared
            # namespace first, then the source, then an existing branch.
            self._refuse_commit_id_name(conn, "branch", name)
            if conn.execute("SELECT 1 FROM tags WHERE name=?", (name,)).fetchone():
                raise Conflict(
                    f"cannot create branch {name!r}: a tag has that name "
                    "(branches, tags and commit ids share one namespace)"
                )
            head = self._resolve(conn, source)
            if conn.execute("SELECT 1 FROM branches WHERE name=?", (name,)).fetchone():
                raise Conflict(f"branch {name!r} already exists")
            conn.execute("INSERT INTO branches(name, head) VALUES (?, ?)", (name, head))
        return head

    def _refuse_commit_id_name(self, conn: sqlite3.Connection, kind: str, name: str) -> None:
        if graph.load(conn, name) is not None:
            raise Conflict(
                f"cannot create {kind} {name!r}: a commit has that id "
                "(branches, tags and commit ids share one namespace)"
            )

    def delete_branch(self, name: str) -> None:
        validate_branch(name)
        with self._db.write() as conn:
            self._branch_head(conn, name)
            if name == self._default_branch(conn):
                raise Conflict(f"branch {name!r} is the repository's default branch and cannot be deleted")
            conn.execute("DELETE FROM branches WHERE name=?", (name,))
            conn.execute("DELETE FROM staging WHERE branch=?", (name,))

    def list_branches(self) -> dict[str, str]:
        rows = self._db.connection().execute("SELECT name, head FROM branches ORDER BY name").fetchall()
        return dict(rows)

    def create_tag(self, tag: str, ref: str) -> str:
        validate_tag(tag)
        with self._db.write() as conn:
            if conn.execute("SELECT 1 FROM branches WHERE name=?", (tag,)).fetchone():
                raise Conflict(
                    f"cannot create tag {tag!r}: a branch has that name "
                    "(branches, tags and commit ids share one namespace)"
                )
            self._refuse_commit_id_name(conn, "tag", tag)
            target = self._resolve(conn, ref)
            existing = conn.execute("SELECT commit_id FROM tags WHERE name=?", (tag,)).fetchone()
            if existing:
                raise Conflict(f"tag {tag!r} already exists (at {existing[0]}); tags are immutable")
            conn.execute("INSERT INTO tags(name, commit_id) VALUES (?, ?)", (tag, target))
        return target

    def delete_tag(self, tag: str) -> None:
        validate_tag(tag)
        with self._db.write() as conn:
            if conn.execute("DELETE FROM tags WHERE name=?", (tag,)).rowcount == 0:
                raise NotFound(f"tag {tag!r} not found in repository {str(self.root)!r}")

    def list_tags(self) -> dict[str, str]:
        rows = self._db.connection().execute("SELECT name, commit_id FROM tags ORDER BY name").fetchall()
        return dict(rows)

    # objects

    def put(self, branch: str, path: str, data: PutSource) -> ObjectStat:
        validate_branch(branch)
        validate_key(path)
        self._branch_head(self._db.connection(), branch)  # fail before copying gigabytes in vain
        try:
            sha256, size = self._objects.write(data)
        except DiskFull as exc:
            raise DiskFull(f"storing {path!r} on branch {branch!r}: {exc}") from None
        except OSError as exc:
            raise RepoError(f"storing {path!r} on branch {branch!r} failed: {exc}") from exc
        mtime = time.time()
        with self._db.write() as conn:
            self._branch_head(conn, branch)
            conn.execute(
                "INSERT OR REPLACE INTO staging(branch, path, sha256, size, mtime) VALUES (?,?,?,?,?)",
                (branch, path, sha256, size, mtime),
            )
        return ObjectStat(path=path, size=size, checksum=sha256, mtime=mtime)

    def open(self, ref: str, path: str) -> BinaryIO:
        sha256, _, _ = self._entry(ref, path)
        return self._objects.open(sha256, f"{ref}:{path}")

    def get(self, ref: str, path: str) -> bytes:
        with self.open(ref, path) as reader:
            return reader.read()

    def stat(self, ref: str, path: str) -> ObjectStat:
        sha256, size, mtime = self._entry(ref, path)
        return ObjectStat(path=path, size=size, checksum=sha256, mtime=mtime)

    def exists(self, ref: str, path: str) -> bool:
        return self._find(ref, path) is not None

    def list(self, ref: str, prefix: str = "") -> Iterator[ObjectStat]:
        validate_key_prefix(prefix)
        with self._db.read() as conn:
            cid, branch = self._resolve_with_branch(conn, ref)
            tree = self._commit(conn, cid).tree
            staged = self._staged(conn, branch, prefix) if branch else []
        return self._list(tree, staged, prefix)

    def _list(
        self, tree: str, staged: list[tuple[str, trees.FileEntry | None]], prefix: str
    ) -> Iterator[ObjectStat]:
        # Merge the committed tree (in path order) with the staged rows (in path order).
        conn = self._db.connection()
        committed = trees.iterate(conn, tree, prefix)
        pending = next(committed, None)
        for path, entry in staged:
            while pending is not None and pending[0] < path:
                yield _stat(*pending)
                pending = next(committed, None)
            if pending is not None and pending[0] == path:
                pending = next(committed, None)
            if entry is not None:
                yield _stat(path, entry)
        while pending is not None:
            yield _stat(*pending)
            pending = next(committed, None)

    def delete(self, branch: str, path: str) -> None:
        validate_branch(branch)
        validate_key(path)
        with self._db.write() as conn:
            head = self._branch_head(conn, branch)
            staged = conn.execute(
                "SELECT sha256 FROM staging WHERE branch=? AND path=?", (branch, path)
            ).fetchone()
            committed = trees.lookup(conn, self._commit(conn, head).tree, path)
            if (staged is not None and staged[0] is None) or (staged is None and committed is None):
                raise NotFound(f"object {path!r} not found on branch {branch!r}")
            if committed is None:
                conn.execute("DELETE FROM staging WHERE branch=? AND path=?", (branch, path))
            else:
                conn.execute(
                    "INSERT OR REPLACE INTO staging(branch, path, sha256, size, mtime) VALUES (?,?,NULL,NULL,?)",
                    (branch, path, time.time()),
                )

    # history

    def commit(
        self,
        branch: str,
        message: str,
        metadata: dict[str, str] | None = None,
        allow_empty: bool = False,
    ) -> Commit:
        validate_branch(branch)
        metadata = validate_metadata(metadata)
        objects = self._objects  # opened outside the write transaction (it reads the object hash)
        with self._db.write() as conn:
            head = self._commit(conn, self._branch_head(conn, branch))
            staged = self._staged(conn, branch, "")
            objects.make_durable({entry[0] for _, entry in staged if entry is not None})
            # As lakeFS (pkg/graveler/committed/commit.go): a staged entry equal to the
            # committed one is no change, so re-uploading the same bytes commits nothing.
            tree = trees.apply_changes(conn, head.tree, dict(staged))
            if tree == head.tree and not allow_empty:
                raise NoChanges(
                    f"branch {branch!r} has no uncommitted changes to commit"
                    + (" (every staged object equals the committed one)" if staged else "")
                )
            row = _new_commit(conn, tree, (head.id,), message, metadata)
            self._move_branch(conn, branch, head.id, row.id)
            conn.execute("DELETE FROM staging WHERE branch=?", (branch,))
        return row.to_commit()

    def merge(
        self,
        source: str,
        destination: str,
        message: str = "",
        metadata: dict[str, str] | None = None,
    ) -> str:
        validate_branch(destination)
        metadata = validate_metadata(metadata)
        # lakeFS Actions: pre-merge hooks in the source's _lakefs_actions/ may refuse (local/actions.py)
        event = MergeEvent(self.resolve(source), destination, self.resolve(destination), message, metadata)
        hooks_ran = check_pre_merge(self, event)
        with self._db.write() as conn:
            ours = self._commit(conn, self._branch_head(conn, destination))
            self._require_clean(conn, destination, ours.tree, "merging into it")
            theirs = self._commit(conn, self._resolve(conn, source))
            if hooks_ran and (theirs.id, ours.id) != (event.source_commit, event.destination_head):
                raise Conflict(
                    f"{source!r} or {destination!r} moved while the pre-merge hooks ran; merge again"
                )
            base_id = graph.merge_base(conn, ours.id, theirs.id)
            base_tree = self._commit(conn, base_id).tree if base_id else trees.EMPTY_TREE
            changes, conflicts = trees.three_way(conn, base_tree, ours.tree, theirs.tree)
            if conflicts:
                raise MergeConflict(source, destination, conflicts)
            if changes is None:
                raise NoChanges(
                    f"nothing to merge from {source!r} into {destination!r}: no changes since their base"
                )
            tree = trees.apply_changes(conn, ours.tree, changes)
            row = _new_commit(
                conn,
                tree,
                (ours.id, theirs.id),
                message or f"Merge {source!r} into {destination!r}",
                metadata,
            )
            self._move_branch(conn, destination, ours.id, row.id)
        return row.id

    def revert(
        self,
        branch: str,
        commit_id: str,
        parent_number: int = 1,
        metadata: dict[str, str] | None = None,
    ) -> Commit:
        validate_branch(branch)
        metadata = validate_metadata(metadata)
        with self._db.write() as conn:
            head = self._commit(conn, self._branch_head(conn, branch))
            reverted = self._commit(conn, self._resolve(conn, commit_id))
            if not 1 <= parent_number <= len(reverted.parents):
                raise InvalidPath(
                    f"commit {reverted.id} has {len(reverted.parents)} parent(s); "
                    f"parent_number {parent_number} does not name one"
                )
            self._require_clean(conn, branch, head.tree, "reverting on it")
            parent = self._commit(conn, reverted.parents[parent_number - 1])
            changes, conflicts = trees.three_way(conn, reverted.tree, head.tree, parent.tree)
            if conflicts:
                shown = ", ".join(conflicts[:20])
                raise Conflict(
                    f"revert of {reverted.id} on branch {branch!r} conflicts with later changes to: {shown}"
                )
            if not changes:
                raise NoChanges(f"reverting {reverted.id} would not change branch {branch!r}")
            tree = trees.apply_changes(conn, head.tree, changes)
            row = _new_commit(conn, tree, (head.id,), f"Revert {commit_id}", metadata)
            self._move_branch(conn, branch, head.id, row.id)
        return row.to_commit()

    def reset_hard(self, branch: str, ref: str) -> None:
        """Move the head; staged changes stay, as in lakeFS (pkg/graveler/graveler.go ResetHard)."""
        validate_branch(branch)
        with self._db.write() as conn:
            head = self._branch_head(conn, branch)
            target = self._resolve(conn, ref)
            self._move_branch(conn, branch, head, target)

    def discard_uncommitted(self, branch: str) -> None:
        validate_branch(branch)
        with self._db.write() as conn:
            self._branch_head(conn, branch)
            conn.execute("DELETE FROM staging WHERE branch=?", (branch,))

    def log(self, ref: str, limit: int | None = None) -> Iterator[Commit]:
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise InvalidPath(f"log limit must be a non-negative integer, got {limit!r}")
        head = self.resolve(ref)
        return self._log(head, limit)

    def _log(self, head: str, limit: int | None) -> Iterator[Commit]:
        if limit == 0:
            return
        for count, row in enumerate(graph.walk_log(self._db.connection(), head), start=1):
            yield row.to_commit()
            if count == limit:
                return

    def get_commit(self, ref: str) -> Commit:
        with self._db.read() as conn:
            return self._commit(conn, self._resolve(conn, ref)).to_commit()

    def diff(self, left: str, right: str, prefix: str = "") -> list[Change]:
        validate_key_prefix(prefix)
        with self._db.read() as conn:
            left_tree = self._commit(conn, self._resolve(conn, left)).tree
            right_tree = self._commit(conn, self._resolve(conn, right)).tree
            changed = trees.diff(conn, left_tree, right_tree, prefix)
        return [
            Change(path=path, kind="added" if old is None else "removed" if new is None else "changed")
            for path, (old, new) in sorted(changed.items())
        ]

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        with self._db.read() as conn:
            return graph.is_ancestor(conn, self._resolve(conn, ancestor), self._resolve(conn, descendant))

    # internals

    def _resolve(self, conn: sqlite3.Connection, ref: str) -> str:
        return self._resolve_with_branch(conn, ref)[0]

    def _resolve_with_branch(self, conn: sqlite3.Connection, ref: str) -> tuple[str, str | None]:
        """(commit id, branch name if ``ref`` reads a branch with its staged changes).

        lakeFS's grammar: a base ref (full commit id, branch, tag, then unique commit id
        prefix, in that order) and modifiers: ``~N`` (N first parents up), ``^N`` (parent N,
        ``^0`` the commit itself), ``@`` (a branch's head without its staged changes).
        """
        if not isinstance(ref, str) or not ref or _GO_SPACE.search(ref):
            raise InvalidPath(f"ref {ref!r} is not a branch, tag or commit id")
        base, *modifiers = _REF_PARTS.findall(ref)
        if not base:
            raise InvalidPath(f"ref {ref!r} is not a branch, tag or commit id")
        cid, branch = self._resolve_base(conn, base, ref)
        if not modifiers:
            return cid, branch
        for modifier in modifiers:
            kind, count_text = modifier[0], modifier[1:]
            if kind == "$":
                raise InvalidPath(f"ref {ref!r}: staging refs ('$') are not supported; use the branch name")
            if kind == "@":
                if branch is None or len(modifiers) != 1 or count_text:
                    raise InvalidPath(f"ref {ref!r}: '@' stands alone after a branch name")
                return cid, None
            if count_text and not _MODIFIER_COUNT.match(count_text):
                raise InvalidPath(f"ref {ref!r}: cannot parse the modifier {modifier!r}")
            count = int(count_text) if count_text else 1
            if kind == "~":
                for _ in range(count):
                    parents = self._commit(conn, cid).parents
                    if not parents:
                        raise NotFound(
                            f"ref {ref!r} not found in repository {str(self.root)!r}: no such ancestor"
                        )
                    cid = parents[0]
            elif count > 0:  # "^0" is the commit itself
                parents = self._commit(conn, cid).parents
                if count > len(parents):
                    raise InvalidPath(f"ref {ref!r}: commit {cid} has {len(parents)} parent(s)")
                cid = parents[count - 1]
        return cid, None

    def _resolve_base(self, conn: sqlite3.Connection, base: str, ref: str) -> tuple[str, str | None]:
        if _FULL_COMMIT_ID.match(base) and graph.load(conn, base) is not None:
            return base, None
        row = conn.execute("SELECT head FROM branches WHERE name=?", (base,)).fetchone()
        if row:
            return row[0], base
        row = conn.execute("SELECT commit_id FROM tags WHERE name=?", (base,)).fetchone()
        if row:
            return row[0], None
        if _HASH.match(base):
            found = graph.find_by_prefix(conn, base)
            if len(found) == 1:
                return found[0], None
            if len(found) > 1:
                raise NotFound(
                    f"ref {ref!r} is an ambiguous commit id prefix in repository {str(self.root)!r}"
                )
        raise NotFound(f"ref {ref!r} not found in repository {str(self.root)!r}")

    def _branch_head(self, conn: sqlite3.Connection, branch: str) -> str:
        row = conn.execute("SELECT head FROM branches WHERE name=?", (branch,)).fetchone()
        if row is None:
            raise NotFound(f"branch {branch!r} not found in repository {str(self.root)!r}")
        return row[0]

    def _default_branch(self, conn: sqlite3.Connection) -> str:
        row = conn.execute("SELECT value FROM meta WHERE key='default_branch'").fetchone()
        return row[0] if row else "main"

    def _commit(self, conn: sqlite3.Connection, cid: str) -> graph.CommitRow:
        row = graph.load(conn, cid)
        if row is None:
            raise NotFound(f"commit {cid!r} not found in repository {str(self.root)!r}")
        return row

    def _move_branch(self, conn: sqlite3.Connection, branch: str, expected: str, new: str) -> None:
        """Compare-and-swap the branch head, so a head moved by anyone else is never overwritten."""
        moved = conn.execute(
            "UPDATE branches SET head=? WHERE name=? AND head=?", (new, branch, expected)
        ).rowcount
        if moved != 1:
            raise Conflict(f"branch {branch!r} moved while it was being updated; retry")

    def _staged(
        self, conn: sqlite3.Connection, branch: str, prefix: str
    ) -> list[tuple[str, trees.FileEntry | None]]:
        # A range scan, not substr(): keys may hold any character, NUL included.
        rows = conn.execute(
            "SELECT path, sha256, size, mtime FROM staging WHERE branch=? AND path >= ? ORDER BY path",
            (branch, prefix),
        )
        staged = []
        for path, sha256, size, mtime in rows:
            if not path.startswith(prefix):
                break
            staged.append((path, None if sha256 is None else (sha256, size, mtime)))
        rows.close()
        return staged  # SQLite's BINARY order of UTF-8 is Python's order of the strings

    def _require_clean(self, conn: sqlite3.Connection, branch: str, head_tree: str, doing: str) -> None:
        """Conflict if a staged entry differs from the head's (lakeFS's dirty-branch test)."""
        for path, entry in self._staged(conn, branch, ""):
            if not trees.same_content(entry, trees.lookup(conn, head_tree, path)):
                raise Conflict(
                    f"branch {branch!r} has uncommitted changes; commit or discard them before {doing}"
                )

    def _entry(self, ref: str, path: str) -> trees.FileEntry:
        entry = self._find(ref, path)
        if entry is None:
            raise NotFound(f"object {path!r} not found at {ref!r}")
        return entry

    def _find(self, ref: str, path: str) -> trees.FileEntry | None:
        """The entry ``path`` has at ``ref`` (staged changes included on a branch), or None."""
        validate_key(path)
        with self._db.read() as conn:
            cid, branch = self._resolve_with_branch(conn, ref)
            if branch is not None:
                staged = conn.execute(
                    "SELECT sha256, size, mtime FROM staging WHERE branch=? AND path=?", (branch, path)
                ).fetchone()
                if staged is not None:
                    return None if staged[0] is None else (staged[0], staged[1], staged[2])
            return trees.lookup(conn, self._commit(conn, cid).tree, path)


def _stat(path: str, entry: trees.FileEntry) -> ObjectStat:
    return ObjectStat(path=path, size=entry[1], checksum=entry[0], mtime=entry[2])


def _new_commit(
    conn: sqlite3.Connection, tree: str, parents: tuple[str, ...], message: str, metadata: dict[str, str]
) -> graph.CommitRow:
    parent_rows = [graph.load(conn, parent) for parent in parents]
    # Never older than a parent, so log order stays child-first even across skewed clocks.
    created = max([time.time(), *(p.created for p in parent_rows if p)])
    generation = 1 + max((p.generation for p in parent_rows if p), default=0)
    cid = graph.commit_id(tree, parents, message, metadata, created)
    row = graph.CommitRow(cid, tree, parents, message, metadata, created, generation)
    graph.insert(conn, row)
    return row


def _name_from_directory(root: Path) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", root.name.lower()).strip("-")[:63].strip("-")
    if len(name) < 3:
        name = f"{name}-repo" if name else "repo"
    return name


@functools.lru_cache(maxsize=16)
def _opened_in_this_process(root: str, name: str, durable: bool) -> LocalRepo:
    """The one LocalRepo per directory that a process unpickles: the tasks that each carry the
    repository share it, so a worker keeps one database connection per thread, not one per task
    (each holds up to 2 MB of SQLite page cache)."""
    return LocalRepo(root, name, durable=durable)
