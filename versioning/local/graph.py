"""The commit graph: commit rows, canonical commit ids, log order, ancestry, merge bases.

Every commit stores its generation (1 + the largest parent generation), which bounds
the graph walks: nothing below an ancestor's generation can lead to it, and popping
commits highest generation first meets the nearest common ancestor before any other.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass

from versioning.port import Commit


@dataclass(frozen=True)
class CommitRow:
    id: str
    tree: str
    parents: tuple[str, ...]
    message: str
    metadata: dict[str, str]
    created: float
    generation: int

    def to_commit(self) -> Commit:
        return Commit(
            id=self.id,
            parents=self.parents,
            message=self.message,
            metadata=dict(self.metadata),
            created=self.created,
        )


def commit_id(
    tree: str, parents: tuple[str, ...], message: str, metadata: dict[str, str], created: float
) -> str:
    """sha256 of the commit's canonical JSON: equal content, equal id."""
    canonical = json.dumps(
        {
            "tree": tree,
            "parents": list(parents),
            "message": message,
            "metadata": metadata,
            "created": created,
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def insert(conn: sqlite3.Connection, row: CommitRow) -> None:
    conn.execute(
        "INSERT OR IGNORE INTO commits(id, tree, parents, message, metadata, created, generation)"
        " VALUES (?,?,?,?,?,?,?)",
        (
            row.id,
            row.tree,
            json.dumps(list(row.parents)),
            row.message,
            json.dumps(row.metadata, sort_keys=True, ensure_ascii=False),
            row.created,
            row.generation,
        ),
    )


# Commit ids are content hashes: a row read once never changes (absent ids are not cached).
_LOADED: dict[str, CommitRow] = {}
_LOADED_CACHE_SIZE = 50_000


def load(conn: sqlite3.Connection, cid: str) -> CommitRow | None:
    cached = _LOADED.get(cid)
    if cached is not None:
        return cached
    row = conn.execute(
        "SELECT id, tree, parents, message, metadata, created, generation FROM commits WHERE id=?", (cid,)
    ).fetchone()
    if row is None:
        return None
    loaded = CommitRow(row[0], row[1], tuple(json.loads(row[2])), row[3], json.loads(row[4]), row[5], row[6])
    if len(_LOADED) >= _LOADED_CACHE_SIZE:
        _LOADED.clear()
    _LOADED[cid] = loaded
    return loaded


def find_by_prefix(conn: sqlite3.Connection, prefix: str) -> list[str]:
    """Commit ids starting with ``prefix`` (at most two: enough to tell unique from ambiguous)."""
    upper = prefix + "g"  # 'g' sorts after every hex digit
    rows = conn.execute("SELECT id FROM commits WHERE id >= ? AND id < ? LIMIT 2", (prefix, upper)).fetchall()
    return [row[0] for row in rows]


class _Cache:
    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn
        self.rows: dict[str, CommitRow] = {}

    def __call__(self, cid: str) -> CommitRow:
        row = self.rows.get(cid)
        if row is None:
            row = load(self.conn, cid)
            if row is None:
                raise KeyError(cid)  # a parent id always has a row: the graph is closed
            self.rows[cid] = row
        return row


def walk_log(conn: sqlite3.Connection, head: str) -> Iterator[CommitRow]:
    """Commits reachable from ``head``, newest first; a child always before its parents."""
    get = _Cache(conn)
    start = get(head)
    queue = [(-start.created, -start.generation, start.id)]
    queued = {start.id}
    while queue:
        _, _, cid = heapq.heappop(queue)
        row = get(cid)
        yield row
        for parent in row.parents:
            if parent not in queued:
                queued.add(parent)
                parent_row = get(parent)
                heapq.heappush(queue, (-parent_row.created, -parent_row.generation, parent))


def is_ancestor(conn: sqlite3.Connection, ancestor: str, descendant: str) -> bool:
    if ancestor == descendant:
        return True
    get = _Cache(conn)
    floor = get(ancestor).generation
    stack, seen = [descendant], {descendant}
    while stack:
        row = get(stack.pop())
        for parent in row.parents:
            if parent == ancestor:
                return True
            if parent not in seen and get(parent).generation > floor:
                seen.add(parent)
                stack.append(parent)
    return False


def merge_base(conn: sqlite3.Connection, a: str, b: str) -> str | None:
    """The nearest common ancestor of ``a`` and ``b`` (highest generation), or None."""
    if a == b:
        return a
    get = _Cache(conn)
    reached = {a: 1, b: 2}
    queue = [(-get(a).generation, a), (-get(b).generation, b)]
    heapq.heapify(queue)
    while queue:
        _, cid = heapq.heappop(queue)
        if reached[cid] == 3:
            return cid
        for parent in get(cid).parents:
            if parent in reached:
                # The parent's generation is below every commit popped so far, so it is
                # still queued and its flags are complete by the time it is popped.
                reached[parent] |= reached[cid]
            else:
                reached[parent] = reached[cid]
                heapq.heappush(queue, (-get(parent).generation, parent))
    return None
