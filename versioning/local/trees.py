"""Trees: a commit's path -> (sha256, size, mtime) mapping, stored like git's.

Each directory is a content-addressed tree (its id is the sha256 of its sorted
entries) whose rows live in the ``tree_entries`` table. A commit that changes one
object rewrites only the directories on that object's path, and a diff skips every
subtree whose id is equal on both sides, so commits and diffs over ~100k objects
touch only what changed. A name may be both a file and a directory (``a`` and
``a/b`` are distinct object keys, as in an object store). Keys are split on every
``/`` and nothing else: any lakeFS key has a place, so ``a//b`` is file ``b`` in
directory ``""`` in directory ``a``, ``dir/`` is file ``""`` in ``dir``, and ``..`` is
a name like any other (trees never touch the file system).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections import defaultdict
from collections.abc import Iterator

FileEntry = tuple[str, int, float]  # sha256, size, mtime
Row = tuple[str, int, str, int, float]  # name, is_dir, target (sha256 or tree id), size, mtime

EMPTY_TREE = hashlib.sha256(b"[]").hexdigest()


def same_content(a: FileEntry | None, b: FileEntry | None) -> bool:
    """Equal bytes (mtime is not content)."""
    if a is None or b is None:
        return a is b
    return a[0] == b[0] and a[1] == b[1]


def lookup(conn: sqlite3.Connection, tree: str, path: str) -> FileEntry | None:
    *dirs, name = path.split("/")
    for part in dirs:
        subtree = subdirectory(conn, tree, part)
        if subtree is None:
            return None
        tree = subtree
    row = conn.execute(
        "SELECT target, size, mtime FROM tree_entries WHERE tree=? AND is_dir=0 AND name=?", (tree, name)
    ).fetchone()
    return None if row is None else (row[0], row[1], row[2])


# Trees are content-addressed, so (tree id, name) -> subtree id never changes, in any
# repository: cache it (cleared when large) to spare path walks their repeated queries.
_SUBDIRECTORIES: dict[tuple[str, str], str | None] = {}
_SUBDIRECTORY_CACHE_SIZE = 200_000


def subdirectory(conn: sqlite3.Connection, tree: str, name: str) -> str | None:
    key = (tree, name)
    if key in _SUBDIRECTORIES:
        return _SUBDIRECTORIES[key]
    row = conn.execute(
        "SELECT target FROM tree_entries WHERE tree=? AND is_dir=1 AND name=?", (tree, name)
    ).fetchone()
    if len(_SUBDIRECTORIES) >= _SUBDIRECTORY_CACHE_SIZE:
        _SUBDIRECTORIES.clear()
    _SUBDIRECTORIES[key] = subtree = None if row is None else row[0]
    return subtree


def iterate(conn: sqlite3.Connection, tree: str, prefix: str = "") -> Iterator[tuple[str, FileEntry]]:
    """Every (path, entry) under ``prefix`` (a plain string prefix), in path order."""
    directory, slash, name_prefix = prefix.rpartition("/")
    base = ""
    if slash:  # "/x" lies in the directory named "", not in the root
        for part in directory.split("/"):
            subtree = subdirectory(conn, tree, part)
            if subtree is None:
                return
            tree = subtree
        base = directory + "/"
    yield from _walk(conn, tree, base, name_prefix)


def _walk(
    conn: sqlite3.Connection, tree: str, base: str, name_prefix: str
) -> Iterator[tuple[str, FileEntry]]:
    rows = [row for row in _rows(conn, tree) if row[0].startswith(name_prefix)]
    # Sorting a directory as "name/" makes a depth-first walk emit full paths in order.
    rows.sort(key=lambda row: row[0] + "/" if row[1] else row[0])
    for name, is_dir, target, size, mtime in rows:
        if is_dir:
            yield from _walk(conn, target, f"{base}{name}/", "")
        else:
            yield base + name, (target, size, mtime)


def apply_changes(conn: sqlite3.Connection, tree: str, changes: dict[str, FileEntry | None]) -> str:
    """The id of ``tree`` with ``changes`` applied (None removes a path); stores new trees.

    The result equals ``tree`` exactly when no change alters content: an entry equal to the
    one in ``tree`` keeps the old row, and removing an absent path does nothing.
    """
    if not changes:
        return tree
    return _apply(conn, tree, changes)


def _apply(conn: sqlite3.Connection, tree: str, changes: dict[str, FileEntry | None]) -> str:
    entries: dict[tuple[str, int], Row] = {(row[0], row[1]): row for row in _rows(conn, tree)}
    below: dict[str, dict[str, FileEntry | None]] = defaultdict(dict)
    for relative, entry in changes.items():
        head, slash, rest = relative.partition("/")
        if slash:
            below[head][rest] = entry
        elif entry is None:
            entries.pop((head, 0), None)
        else:
            old = entries.get((head, 0))
            # Equal content keeps the committed row (its mtime too), as lakeFS keeps an entry
            # of equal identity: a tree id then changes only when some content does.
            if old is None or not same_content((old[2], old[3], old[4]), entry):
                entries[(head, 0)] = (head, 0, entry[0], entry[1], entry[2])
    for name, sub_changes in below.items():
        old = entries.get((name, 1))
        subtree = _apply(conn, old[2] if old else EMPTY_TREE, sub_changes)
        if subtree == EMPTY_TREE:  # a directory exists only while it holds objects
            entries.pop((name, 1), None)
        else:
            entries[(name, 1)] = (name, 1, subtree, 0, 0.0)
    return _store(conn, sorted(entries.values()))


def _store(conn: sqlite3.Connection, rows: list[Row]) -> str:
    if not rows:
        return EMPTY_TREE
    tree = hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()
    if conn.execute("SELECT 1 FROM tree_entries WHERE tree=? LIMIT 1", (tree,)).fetchone() is None:
        conn.executemany(
            "INSERT OR IGNORE INTO tree_entries(tree, name, is_dir, target, size, mtime) VALUES (?,?,?,?,?,?)",
            [(tree, *row) for row in rows],
        )
    return tree


def diff(
    conn: sqlite3.Connection, left: str, right: str, prefix: str = ""
) -> dict[str, tuple[FileEntry | None, FileEntry | None]]:
    """Paths under ``prefix`` whose content differs: path -> (left entry, right entry)."""
    changed: dict[str, tuple[FileEntry | None, FileEntry | None]] = {}
    _diff(conn, left, right, "", prefix, changed)
    return changed


def _diff(
    conn: sqlite3.Connection,
    left: str,
    right: str,
    base: str,
    prefix: str,
    changed: dict[str, tuple[FileEntry | None, FileEntry | None]],
) -> None:
    if left == right:
        return
    left_rows = {(row[0], row[1]): row for row in _rows(conn, left)}
    right_rows = {(row[0], row[1]): row for row in _rows(conn, right)}
    for key in left_rows.keys() | right_rows.keys():
        name, is_dir = key
        path = base + name
        a, b = left_rows.get(key), right_rows.get(key)
        if is_dir:
            directory = path + "/"
            if directory.startswith(prefix) or prefix.startswith(directory):
                _diff(conn, a[2] if a else EMPTY_TREE, b[2] if b else EMPTY_TREE, directory, prefix, changed)
        elif path.startswith(prefix):
            old = (a[2], a[3], a[4]) if a else None
            new = (b[2], b[3], b[4]) if b else None
            if not same_content(old, new):
                changed[path] = (old, new)


def _rows(conn: sqlite3.Connection, tree: str) -> list[Row]:
    if tree == EMPTY_TREE:
        return []
    return conn.execute(
        "SELECT name, is_dir, target, size, mtime FROM tree_entries WHERE tree=?", (tree,)
    ).fetchall()


def three_way(
    conn: sqlite3.Connection, base: str, ours: str, theirs: str
) -> tuple[dict[str, FileEntry | None] | None, list[str]]:
    """Changes to apply to ``ours`` to bring in ``theirs``' changes since ``base``, and the
    paths both sides changed differently. None when ``theirs`` changed nothing."""
    their_changes = diff(conn, base, theirs)
    if not their_changes:
        return None, []
    our_changes = diff(conn, base, ours)
    changes: dict[str, FileEntry | None] = {}
    conflicts: list[str] = []
    for path, (_, theirs_entry) in their_changes.items():
        if path in our_changes:
            if not same_content(our_changes[path][1], theirs_entry):
                conflicts.append(path)
            continue  # the same change is already on our side
        changes[path] = theirs_entry
    return changes, sorted(conflicts)
