"""The SQLite half of a local repository: schema, per-thread connections, transactions.

Refs, commits, trees and staging live in one SQLite database in WAL mode, so readers
never block the single writer and every ref update is one transaction. Writers take
the write lock up front (``BEGIN IMMEDIATE``) and wait for it up to the busy timeout;
a lock still held after that surfaces as :class:`TransientError` (retry it).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from versioning.port import NotFound, RepoError, TransientError

SCHEMA_VERSION = "1"
BUSY_TIMEOUT_S = 120.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS commits(
    id TEXT PRIMARY KEY,
    tree TEXT NOT NULL,
    parents TEXT NOT NULL,
    message TEXT NOT NULL,
    metadata TEXT NOT NULL,
    created REAL NOT NULL,
    generation INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tree_entries(
    tree TEXT NOT NULL,
    name TEXT NOT NULL,
    is_dir INTEGER NOT NULL,
    target TEXT NOT NULL,
    size INTEGER NOT NULL,
    mtime REAL NOT NULL,
    PRIMARY KEY (tree, is_dir, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS branches(name TEXT PRIMARY KEY, head TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tags(name TEXT PRIMARY KEY, commit_id TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS staging(
    branch TEXT NOT NULL,
    path TEXT NOT NULL,
    sha256 TEXT,
    size INTEGER,
    mtime REAL,
    PRIMARY KEY (branch, path)
) WITHOUT ROWID;
"""


class Database:
    """One SQLite file; each thread (and each forked process) gets its own connection."""

    def __init__(self, path: Path):
        self.path = path
        self._local = threading.local()

    def exists(self) -> bool:
        return self.path.is_file()

    def connection(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        # A connection inherited through fork() must not be used by the child.
        if conn is not None and self._local.pid == os.getpid():
            return conn
        if not self.exists():
            raise NotFound(
                f"no repository at {self.path.parent}: check the path (a curate run creates the repository)"
            )
        conn = self._open(create=False)
        self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            conn.close()
        self._local.conn = None

    def create_schema(self) -> None:
        """Create the database file and tables if absent (idempotent, safe to race)."""
        conn = self._open(create=True)
        try:
            with _translated(self.path):
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("BEGIN IMMEDIATE")
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(
                    "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,)
                )
                conn.execute("COMMIT")
        finally:
            conn.close()

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction holding SQLite's write lock from the start."""
        conn = self.connection()
        with _translated(self.path):
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every query inside sees the same snapshot."""
        conn = self.connection()
        with _translated(self.path):
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")

    def _open(self, create: bool) -> sqlite3.Connection:
        mode = "rwc" if create else "rw"
        with _translated(self.path):
            conn = sqlite3.connect(
                f"file:{self.path}?mode={mode}",
                uri=True,
                timeout=BUSY_TIMEOUT_S,
                isolation_level=None,
                check_same_thread=False,
            )
            conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            # WAL + NORMAL never corrupts on a crash; a power loss may drop the newest
            # transactions, never half of one.
            conn.execute("PRAGMA synchronous=NORMAL")
        return conn


@contextmanager
def _translated(path: Path) -> Iterator[None]:
    """Turn sqlite3 errors into the port's errors, naming the database but no SQL."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        text = str(exc)
        if "locked" in text or "busy" in text:
            raise TransientError(f"repository database {path} is busy ({text}); retry") from exc
        raise RepoError(f"repository database {path}: {text}") from exc
    except sqlite3.DatabaseError as exc:
        raise RepoError(f"repository database {path} is unreadable: {exc}") from exc
