"""The data-repository port: lakeFS semantics behind one small protocol.

Every adapter (``local``, ``lakefs``) implements :class:`DataRepo` and raises only the
errors defined here, so callers never see SDK exception types. lakeFS (v1.84.0) is the
reference for every semantic question; docs/versioning.md lists the rules with the lakeFS
source each one follows. The ones callers meet most:

* Branch names follow lakeFS's rule (``^\\w[-\\w]*$``, ASCII: no ``/``), so a curate run's
  branch is ``curate-<run>`` rather than ``curate/<run>``. Tag names follow git's ref rules
  as lakeFS applies them (:func:`validate_tag`).
* Branches, tags and commit ids share one namespace: creating a branch named like a tag or
  a commit id, or a tag named like a branch or a commit id, raises :class:`Conflict`.
* Object keys are any non-empty string of at most 1024 bytes (:func:`validate_key`), as in
  lakeFS: reads, listings and copies accept keys written by other tools (``a//b``,
  ``dir/``, ``a/../b``). Paths tokenlake builds itself go through the stricter
  :func:`validate_path` (relative, no empty, ``.`` or ``..`` segment), and so does any key
  turned into a local file path.
* Reading a branch sees its uncommitted (staged) changes, as in lakeFS.
* A staged change is a change only if it differs from the committed entry: re-uploading
  identical bytes changes nothing. ``commit`` with no such change raises
  :class:`NoChanges` unless ``allow_empty``.
* ``merge`` with nothing new on the source raises :class:`NoChanges`; a merge into, or a
  revert on, a branch with uncommitted changes raises :class:`Conflict`.
* ``reset_hard`` moves the branch head and keeps its uncommitted changes (as lakeFS's hard
  reset does); call ``discard_uncommitted`` first for a clean branch.
* ``diff(left, right)`` is the direct (two-dot) difference: what turns left into right.
* Commit metadata is ``dict[str, str]``; a value that is not a string is refused, and so is
  a key in lakeFS's reserved ``.lakefs.`` namespace (the server adds such keys itself, e.g.
  ``.lakefs.merge.strategy`` on merge commits, and adapters do not return them).
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
        """Create ``name`` at ``source``; returns its commit id.

        Conflict if a branch, a tag or a commit id already has that name.
        """

    def delete_branch(self, name: str) -> None: ...

    def list_branches(self) -> dict[str, str]:
        """Branch name -> head commit id."""

    def create_tag(self, tag: str, ref: str) -> str:
        """Tag the commit ``ref`` resolves to; returns that commit id.

        Conflict if a tag, a branch or a commit id already has that name (tags are immutable).
        """

    def delete_tag(self, tag: str) -> None: ...

    def list_tags(self) -> dict[str, str]:
        """Tag -> commit id."""

    # objects
    def put(self, branch: str, path: str, data: PutSource) -> ObjectStat:
        """Stage an object on ``branch``; streamed from file objects and paths.

        ``path`` is any lakeFS key (:func:`validate_key`), so that objects can be copied
        between refs whatever their keys; paths tokenlake builds go through ``validate_path``.
        """

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
    ) -> Commit:
        """Commit the branch's uncommitted changes.

        NoChanges when no staged entry differs from the committed one (identical bytes
        re-uploaded are no change), unless ``allow_empty``.
        """

    def merge(
        self,
        source: str,
        destination: str,
        message: str = "",
        metadata: dict[str, str] | None = None,
    ) -> str:
        """Merge ``source`` (any ref) into branch ``destination``; returns the merge commit id.

        Always a merge commit (parents: destination head, source), never a fast-forward.
        NoChanges when the source changed nothing since the merge base; Conflict when the
        destination has uncommitted changes; MergeConflict (listing the paths) when both
        sides changed a path since their base.
        """

    def revert(
        self,
        branch: str,
        commit_id: str,
        parent_number: int = 1,
        metadata: dict[str, str] | None = None,
    ) -> Commit:
        """A new commit on ``branch`` that undoes ``commit_id`` (against parent N for merges).

        Conflict when the branch has uncommitted changes or a path was changed again since;
        NoChanges when the revert would change nothing.
        """

    def reset_hard(self, branch: str, ref: str) -> None:
        """Point ``branch`` at the commit ``ref`` resolves to, in one atomic step.

        As lakeFS's hard reset: commits after that one leave the branch, and its uncommitted
        changes stay (now relative to the new head; a staged entry equal to the new head's is
        no change any more). For a clean branch, ``discard_uncommitted`` first: the two
        calls are not atomic together, so do it only on a branch no one else writes to.
        """

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
_REPO_RE = re.compile(r"^[a-z0-9][a-z0-9-]{2,62}$")
MAX_KEY_BYTES = 1024
RESERVED_METADATA_PREFIX = ".lakefs."


def validate_key(path: str) -> str:
    """Return ``path`` if lakeFS accepts it as an object key; raise InvalidPath otherwise.

    lakeFS (``pkg/catalog/validate.go``) takes any non-empty key of at most 1024 bytes:
    ``a//b``, ``dir/``, ``/abs`` and ``a/../b`` are keys like any other. Reads, listings,
    deletes and copies take these, so a repository written by other tools stays readable.
    """
    if not isinstance(path, str) or not path:
        raise InvalidPath("object path must be a non-empty string")
    try:
        encoded = path.encode()
    except UnicodeEncodeError:
        raise InvalidPath(f"object path {path!r} is not valid Unicode (a lone surrogate)") from None
    if len(encoded) > MAX_KEY_BYTES:
        raise InvalidPath(f"object path {path[:40]!r}... is {len(encoded)} bytes; lakeFS allows at most 1024")
    return path


def validate_key_prefix(prefix: str) -> str:
    """A listing prefix: empty, or the start of a key (at most 1024 bytes)."""
    if prefix == "":
        return prefix
    return validate_key(prefix)


def validate_path(path: str) -> str:
    """Return ``path`` if it is a safe relative path; raise InvalidPath otherwise.

    Stricter than :func:`validate_key`: for the paths tokenlake builds itself and for any key
    that becomes a local file path (no NUL, not absolute, no empty, ``.`` or ``..`` segment).
    """
    validate_key(path)
    if "\x00" in path:
        raise InvalidPath(f"object path {path!r} contains a NUL byte")
    if path.startswith("/") or path.startswith("\\") or re.match(r"^[A-Za-z]:", path):
        raise InvalidPath(f"object path {path!r} is absolute; use a path relative to the repository root")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise InvalidPath(f"object path {path!r} has an empty, '.' or '..' segment")
    return path


def validate_branch(name: str) -> str:
    """lakeFS's branch rule (``pkg/validator/validate.go``): ASCII letters, digits, '_' and '-'."""
    if not isinstance(name, str) or not _BRANCH_RE.match(name):
        raise InvalidPath(
            f"branch name {name!r} is invalid: use letters, digits, '_' and '-' (not starting with '-')"
        )
    return name


def validate_tag(tag: str) -> str:
    """lakeFS's tag rule (``pkg/graveler/validate.go``, after git-check-ref-format).

    Refused: empty, ``@``, a name ending in ``.`` or ``.lock``, containing ``..``, ``/`` or
    ``@{``, any of ``^ : ? * [ \\``, a space or a control character. Anything else is a
    tag, ``v1.0+build``, ``-v1`` and ``täg`` included (unlike git, ``~`` is allowed).
    """
    if not isinstance(tag, str) or not tag:
        raise InvalidPath("tag name must be a non-empty string")
    problem = None
    if tag == "@":
        problem = "'@' alone"
    elif tag.endswith(".") or tag.endswith(".lock"):
        problem = "it ends in '.' or '.lock'"
    elif any(part in tag for part in ("..", "/", "@{")):
        problem = "it contains '..', '/' or '@{'"
    elif any(char in tag for char in "^:?*[\\"):
        problem = "it contains one of ^ : ? * [ \\"
    elif any(ord(char) <= 0x20 for char in tag):
        problem = "it contains a space or a control character"
    if problem:
        raise InvalidPath(
            f"tag name {tag!r} is invalid: {problem} (git-style ref rules, as lakeFS checks them)"
        )
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
            raise InvalidPath(
                f"commit metadata must map strings to strings; {key!r} -> {type(value).__name__}"
            )
        if key.startswith(RESERVED_METADATA_PREFIX):
            raise InvalidPath(
                f"commit metadata key {key!r} is in lakeFS's reserved {RESERVED_METADATA_PREFIX!r} namespace"
            )
    return metadata


def user_metadata(metadata: dict[str, str]) -> dict[str, str]:
    """Commit metadata without the keys lakeFS adds itself (``.lakefs.merge.strategy``, ...)."""
    return {key: value for key, value in metadata.items() if not key.startswith(RESERVED_METADATA_PREFIX)}
