"""The data-repository port: lakeFS semantics behind one small protocol.

Every adapter (``local``, ``lakefs``) implements :class:`DataRepo` and raises only the
errors defined here, so callers never see SDK exception types.

Decisions where lakeFS and DESIGN.md are silent or disagree:

* Branch names follow lakeFS's rule (``^\\w[-\\w]*$``: no ``/``), so a curate run's
  branch is ``curate-<run>`` rather than ``curate/<run>``.
* Reading a branch sees its uncommitted (staged) changes, as in lakeFS.
* ``commit`` with nothing staged raises :class:`NoChanges` unless ``allow_empty``.
* ``merge`` with nothing new on the source raises :class:`NoChanges`; a merge into a
  branch with uncommitted changes raises :class:`Conflict`.
* ``diff(left, right)`` is the direct (two-dot) difference: what turns left into right.
* Commit metadata is ``dict[str, str]``; a value that is not a string is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from os import PathLike
from typing import BinaryIO, Literal, Protocol, runtime_checkable


class RepoError(Exception):
    """Base class of every error a DataRepo raises."""


class NotFound(RepoError):
    """A ref, object or repository does not exist."""


class Conflict(RepoError):
    """The operation conflicts with the repository's state (ref exists, dirty branch, ...)."""


class MergeConflict(Conflict):
    """Both sides of a merge changed the same paths."""

    def __init__(self, source: str, destination: str, paths: list[str]):
        self.source = source
        self.destination = destination
        self.paths = sorted(paths)
        shown = ", ".join(self.paths[:20]) + (" ..." if len(self.paths) > 20 else "")
        super().__init__(
            f"merge of {source!r} into {destination!r} conflicts on {len(self.paths)} path(s): {shown}"
        )


class NoChanges(RepoError):
    """A commit or merge would change nothing."""


class HookFailed(RepoError):
    """A pre-merge hook (lakeFS Actions, ``_lakefs_actions/`` of the source) refused the merge; the
    message is the hook's. lakeFS answers HTTP 412; the local repository runs the same hooks."""


class TransientError(RepoError):
    """A retryable failure: connection error, 5xx, 429."""


class InvalidPath(RepoError, ValueError):
    """An object path or ref name that the repository refuses."""


@dataclass(frozen=True)
class ObjectStat:
    path: str
    size: int
    checksum: str  # backend-specific content checksum (sha256 for local, etag for lakeFS)
    mtime: float = 0.0


@dataclass(frozen=True)
class Commit:
    id: str
    parents: tuple[str, ...]
    message: str
    metadata: dict[str, str] = field(default_factory=dict)
    created: float = 0.0  # seconds since the epoch


@dataclass(frozen=True)
class Change:
    path: str
    kind: Literal["added", "removed", "changed"]


PutSource = bytes | bytearray | memoryview | BinaryIO | str | PathLike[str]
"""``put`` takes bytes, a readable binary file object (streamed), or a local file path."""


@runtime_checkable
class DataRepo(Protocol):
    """A versioned object store with lakeFS semantics (DESIGN.md section 3)."""

    name: str

    def ensure(self, default_branch: str = "main") -> None:
        """Create the repository (with an initial commit on ``default_branch``) if absent."""

    # refs
    def resolve(self, ref: str) -> str:
        """Branch, tag or commit id -> commit id. Raises NotFound naming the ref."""

    def create_branch(self, name: str, source: str = "main") -> str:
        """Create ``name`` at ``source``; returns its commit id. Conflict if it exists."""

    def delete_branch(self, name: str) -> None: ...

    def list_branches(self) -> dict[str, str]:
        """Branch name -> head commit id."""

    def create_tag(self, tag: str, ref: str) -> str:
        """Tag the commit ``ref`` resolves to; returns that commit id. Conflict if it exists."""

    def delete_tag(self, tag: str) -> None: ...

    def list_tags(self) -> dict[str, str]:
        """Tag -> commit id."""

    # objects
    def put(self, branch: str, path: str, data: PutSource) -> ObjectStat:
        """Stage an object on ``branch``; streamed from file objects and paths."""

    def open(self, ref: str, path: str) -> BinaryIO:
        """A streamed binary reader (a context manager). NotFound if absent."""

    def get(self, ref: str, path: str) -> bytes:
        """The whole object; for small objects."""

    def stat(self, ref: str, path: str) -> ObjectStat: ...

    def exists(self, ref: str, path: str) -> bool: ...

    def list(self, ref: str, prefix: str = "") -> Iterator[ObjectStat]:
        """Objects under ``prefix`` in path order."""

    def delete(self, branch: str, path: str) -> None:
        """Stage the removal of ``path``. NotFound if absent."""

    # history
    def commit(
        self,
        branch: str,
        message: str,
        metadata: dict[str, str] | None = None,
        allow_empty: bool = False,
    ) -> Commit: ...

    def merge(
        self,
        source: str,
        destination: str,
        message: str = "",
        metadata: dict[str, str] | None = None,
    ) -> str:
        """Merge ``source`` (any ref) into branch ``destination``; returns the merge commit id.

        MergeConflict (listing the paths) when both sides changed a path since their base.
        """

    def revert(
        self,
        branch: str,
        commit_id: str,
        parent_number: int = 1,
        metadata: dict[str, str] | None = None,
    ) -> Commit:
        """A new commit on ``branch`` that undoes ``commit_id`` (against parent N for merges)."""

    def reset_hard(self, branch: str, ref: str) -> None:
        """Point ``branch`` at ``ref``, dropping staged changes and later commits."""

    def discard_uncommitted(self, branch: str) -> None:
        """Drop every staged change on ``branch``."""

    def log(self, ref: str, limit: int | None = None) -> Iterator[Commit]:
        """Commits reachable from ``ref``, newest first (first-parent order not implied)."""

    def get_commit(self, ref: str) -> Commit: ...

    def diff(self, left: str, right: str, prefix: str = "") -> list[Change]:
        """What changes ``left`` into ``right`` (two-dot), sorted by path."""

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        """True if ``ancestor``'s commit is reachable from ``descendant`` (a commit is its own)."""


_BRANCH_RE = re.compile(r"^\w[-\w]*$", re.ASCII)
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
_REPO_RE = re.compile(r"^[a-z0-9][a-z0-9-]{2,62}$")


def validate_path(path: str) -> str:
    """Return ``path`` if it is a safe relative object path; raise InvalidPath otherwise."""
    if not isinstance(path, str) or not path:
        raise InvalidPath("object path must be a non-empty string")
    if "\x00" in path:
        raise InvalidPath(f"object path {path!r} contains a NUL byte")
    try:
        encoded = path.encode()
    except UnicodeEncodeError:
        raise InvalidPath(f"object path {path!r} is not valid Unicode (a lone surrogate)") from None
    if path.startswith("/") or path.startswith("\\") or re.match(r"^[A-Za-z]:", path):
        raise InvalidPath(f"object path {path!r} is absolute; use a path relative to the repository root")
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise InvalidPath(f"object path {path!r} has an empty, '.' or '..' segment")
    if len(encoded) > 1024:
        raise InvalidPath(f"object path {path[:40]!r}... is longer than 1024 bytes")
    return path


def validate_prefix(prefix: str) -> str:
    """A listing prefix: empty, or a path (a trailing '/' allowed)."""
    if prefix == "":
        return prefix
    validate_path(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


def validate_branch(name: str) -> str:
    if not isinstance(name, str) or not _BRANCH_RE.match(name):
        raise InvalidPath(
            f"branch name {name!r} is invalid: use letters, digits, '_' and '-' (not starting with '-')"
        )
    return name


def validate_tag(tag: str) -> str:
    if not isinstance(tag, str) or not _TAG_RE.match(tag) or ".." in tag:
        raise InvalidPath(f"tag {tag!r} is invalid: use letters, digits, '.', '_' and '-'")
    return tag


def validate_repo_name(name: str) -> str:
    if not isinstance(name, str) or not _REPO_RE.match(name):
        raise InvalidPath(
            f"repository name {name!r} is invalid: 3-63 characters of lowercase letters, digits and '-'"
        )
    return name


def validate_metadata(metadata: dict[str, str] | None) -> dict[str, str]:
    metadata = dict(metadata or {})
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidPath(f"commit metadata must map strings to strings; {key!r} -> {type(value).__name__}")
    return metadata
