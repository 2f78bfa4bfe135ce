"""LakeFSRepo: the DataRepo port over the official high-level ``lakefs`` SDK.

``lakefs_sdk`` (the generated client under it) is used only where the wrapper has no call or
drops what the port returns: hard reset, revert with commit metadata, merge base, and the
branch/tag listings (the wrapper's listings discard the commit ids).

Writes that are not idempotent (commit, merge, revert) carry a unique ``tokenlake_write_id``
in their commit metadata; after a failure that may have hidden their success, the branch log
is searched for that marker before retrying, so a retried commit never lands twice. The
marker is stripped from the metadata the port returns, and so are the keys lakeFS adds
itself in its ``.lakefs.`` namespace (``.lakefs.merge.strategy`` on every merge commit).
"""

from __future__ import annotations

import itertools
import random
import uuid
from collections.abc import Callable, Iterator
from typing import BinaryIO, TypeVar

import lakefs
import lakefs_sdk

from versioning.lakefs.client import sdk_client
from versioning.lakefs.config import (
    NAMESPACE_PREFIX_ENV,
    LakeFSCredentials,
    lakectl_credentials,
    namespace_prefix,
    presign_setting,
)
from versioning.lakefs.errors import ConflictFound, ErrorMapper, Retrier, RetryPolicy
from versioning.lakefs.streams import known_size, open_stream, replayable
from versioning.port import (
    Change,
    Commit,
    Conflict,
    InvalidPath,
    MergeConflict,
    NotFound,
    ObjectStat,
    PutSource,
    RepoError,
    TransientError,
    user_metadata,
    validate_branch,
    validate_key,
    validate_key_prefix,
    validate_metadata,
    validate_repo_name,
    validate_tag,
)

WRITE_ID = "tokenlake_write_id"
_MARKER_SEARCH_DEPTH = 50
PRESIGN_MIN_BYTES = 8 * 1024 * 1024

T = TypeVar("T")


class LakeFSRepo:
    """A lakeFS repository behind the DataRepo port (see versioning/port.py for the semantics)."""

    def __init__(
        self,
        credentials: LakeFSCredentials,
        repository: str,
        *,
        storage_namespace: str | None = None,
        retry: RetryPolicy | None = None,
        timeout_s: tuple[float, float] = (10.0, 300.0),
        page_size: int = 1000,
        presign_uploads: bool | None = None,
        rng: random.Random | None = None,
    ):
        """``timeout_s``: (connect, read) seconds per request; ``page_size``: listing page (lakeFS caps
        it at 1000); ``presign_uploads``: whether uploads of ``PRESIGN_MIN_BYTES`` or more go straight
        to the object store through a pre-signed URL and are then linked, instead of through the
        lakeFS API (None: ``$TOKENLAKE_LAKEFS_PRESIGN``, else whenever the server's blockstore
        supports it; ``benchmarks/lakefs_io.py`` measures both paths). Set it False where clients
        cannot reach the store lakeFS writes to."""
        if not 1 <= page_size <= 1000:
            raise ValueError(f"page_size must be between 1 and 1000, not {page_size}")
        self.name = validate_repo_name(repository)
        self.page_size = page_size
        self.endpoint = credentials.endpoint
        self.storage_namespace = storage_namespace or f"{namespace_prefix()}/{repository}"
        self.presign_uploads = presign_setting() if presign_uploads is None else presign_uploads
        self._client = sdk_client(credentials, timeout_s)
        self._sdk = self._client.sdk_client
        self._repo = lakefs.Repository(repository, client=self._client)
        self._retry = Retrier(retry or RetryPolicy(), ErrorMapper(self.endpoint, repository), rng)

    @classmethod
    def connect(
        cls, endpoint: str, access_key_id: str, secret_access_key: str, repository: str, **options
    ) -> LakeFSRepo:
        return cls(LakeFSCredentials(endpoint, access_key_id, secret_access_key), repository, **options)

    @classmethod
    def from_lakectl(cls, repository: str, **options) -> LakeFSRepo:
        """Configured the lakectl way: ``LAKECTL_*`` variables, else ``~/.lakectl.yaml``."""
        return cls(lakectl_credentials(), repository, **options)

    def __repr__(self) -> str:
        return f"LakeFSRepo(endpoint={self.endpoint!r}, repository={self.name!r})"

    def __reduce__(self) -> tuple:
        """Pickled as its repository name only: a worker connects again with its own lakectl
        configuration, so keys never travel to (or through) a cluster."""
        return (LakeFSRepo.from_lakectl, (self.name,))

    def _call(self, action: str, fn: Callable[[], T]) -> T:
        return self._retry.call(action, fn)

    # repository

    def ensure(self, default_branch: str = "main") -> None:
        validate_branch(default_branch)
        try:
            self._call(
                f"look up repository {self.name!r}",
                lambda: self._sdk.repositories_api.get_repository(self.name),
            )
            return
        except NotFound:
            pass
        # exist_ok: a create retried after a lost response finds the repository it made.
        try:
            self._call(
                f"create repository {self.name!r} at {self.storage_namespace!r}",
                lambda: self._repo.create(
                    self.storage_namespace, default_branch=default_branch, exist_ok=True
                ),
            )
        except InvalidPath as refused:
            if "already in use" not in str(refused):
                raise
            # lakeFS never reuses a storage namespace, not even a deleted repository's.
            raise Conflict(
                f"cannot create lakeFS repository {self.name!r}: its storage namespace "
                f"{self.storage_namespace!r} is already in use (lakeFS keeps it after a repository is "
                f"deleted); pass another storage_namespace or set {NAMESPACE_PREFIX_ENV}"
            ) from None

    # refs

    def resolve(self, ref: str) -> str:
        return self._commit_of(ref).id

    def _commit_of(self, ref: str) -> lakefs.Commit:
        if not isinstance(ref, str) or not ref:
            raise InvalidPath(f"ref must be a non-empty string, not {ref!r}")
        return self._call(
            f"resolve ref {ref!r}", lambda: lakefs.Reference(self.name, ref, self._client).get_commit()
        )

    def create_branch(self, name: str, source: str = "main") -> str:
        validate_branch(name)
        commit_id = self.resolve(source)
        # Checked first so that, after a lost response, finding the branch proves the create worked.
        if self._call(f"look up branch {name!r}", lambda: self._head_or_none(name)) is not None:
            raise Conflict(
                f"cannot create branch {name!r}: it already exists (lakeFS repository {self.name!r})"
            )
        branch = self._repo.branch(name)
        self._retry.write_once(
            f"create branch {name!r} at {source!r}",
            lambda: branch.create(commit_id),
            lambda: branch if self._head_or_none(name) == commit_id else None,
        )
        return commit_id

    def _head_or_none(self, branch: str) -> str | None:
        try:
            return self._sdk.branches_api.get_branch(self.name, branch).commit_id
        except lakefs_sdk.exceptions.NotFoundException:
            return None

    def delete_branch(self, name: str) -> None:
        validate_branch(name)
        # Checked first so that, after a lost response, a missing branch proves the delete worked.
        if self._call(f"look up branch {name!r}", lambda: self._head_or_none(name)) is None:
            raise NotFound(f"cannot delete branch {name!r}: not found (lakeFS repository {self.name!r})")
        self._retry.write_once(
            f"delete branch {name!r}",
            lambda: self._repo.branch(name).delete(),
            lambda: True if self._head_or_none(name) is None else None,
        )

    def list_branches(self) -> dict[str, str]:
        return {
            ref.id: ref.commit_id
            for ref in self._list_refs("list branches", self._sdk.branches_api.list_branches)
        }

    def create_tag(self, tag: str, ref: str) -> str:
        validate_tag(tag)
        commit_id = self.resolve(ref)
        if self._call(f"look up tag {tag!r}", lambda: self._tag_or_none(tag)) is not None:
            raise Conflict(f"cannot create tag {tag!r}: it already exists (lakeFS repository {self.name!r})")
        lake_tag = self._repo.tag(tag)
        self._retry.write_once(
            f"create tag {tag!r} at {ref!r}",
            lambda: lake_tag.create(commit_id),
            lambda: lake_tag if self._tag_or_none(tag) == commit_id else None,
        )
        return commit_id

    def _tag_or_none(self, tag: str) -> str | None:
        try:
            return self._sdk.tags_api.get_tag(self.name, tag).commit_id
        except lakefs_sdk.exceptions.NotFoundException:
            return None

    def delete_tag(self, tag: str) -> None:
        validate_tag(tag)
        if self._call(f"look up tag {tag!r}", lambda: self._tag_or_none(tag)) is None:
            raise NotFound(f"cannot delete tag {tag!r}: not found (lakeFS repository {self.name!r})")
        self._retry.write_once(
            f"delete tag {tag!r}",
            lambda: self._repo.tag(tag).delete(),
            lambda: True if self._tag_or_none(tag) is None else None,
        )

    def list_tags(self) -> dict[str, str]:
        return {ref.id: ref.commit_id for ref in self._list_refs("list tags", self._sdk.tags_api.list_tags)}

    def _list_refs(
        self, action: str, list_page: Callable[..., lakefs_sdk.RefList]
    ) -> Iterator[lakefs_sdk.Ref]:
        after = ""
        while True:
            page = self._call(
                action, lambda after=after: list_page(self.name, after=after, amount=self.page_size)
            )
            yield from page.results
            if not page.pagination.has_more:
                return
            after = page.pagination.next_offset

    # objects

    def put(self, branch: str, path: str, data: PutSource) -> ObjectStat:
        validate_branch(branch)
        validate_key(path)
        target = self._repo.branch(branch).object(path)

        def upload(chunks: Callable[[], Iterator[bytes]]) -> None:
            with target.writer(mode="wb", pre_sign=presign) as writer:
                for chunk in chunks():
                    writer.write(chunk)

        size = known_size(data)
        # A pre-signed upload costs two more requests (address, link): worth it for large objects only.
        presign = (size is None or size >= PRESIGN_MIN_BYTES) and self._presigned()
        with replayable(data) as chunks:
            # An upload overwrites the path, so retrying it is idempotent.
            self._call(f"put {path!r} on branch {branch!r}", lambda: upload(chunks))
        return self.stat(branch, path)

    def _presigned(self) -> bool:
        if self.presign_uploads is None:
            config = self._call("read the server's storage configuration", self._client.storage_config_by_id)
            self.presign_uploads = bool(config.pre_sign_support)
        return self.presign_uploads

    def open(self, ref: str, path: str) -> BinaryIO:
        stat = self.stat(ref, path)
        reader = lakefs.StoredObject(self.name, ref, path, self._client).reader(mode="rb", pre_sign=False)
        return open_stream(reader, stat.size, self._call, f"read {path!r} at ref {ref!r}")

    def get(self, ref: str, path: str) -> bytes:
        validate_key(path)

        def read_whole() -> bytes:
            with lakefs.StoredObject(self.name, ref, path, self._client).reader(
                mode="rb", pre_sign=False
            ) as reader:
                return reader.read()

        return self._call(f"read {path!r} at ref {ref!r}", read_whole)

    def stat(self, ref: str, path: str) -> ObjectStat:
        validate_key(path)
        info = self._call(
            f"stat {path!r} at ref {ref!r}",
            lambda: lakefs.StoredObject(self.name, ref, path, self._client).stat(),
        )
        return _object_stat(info)

    def exists(self, ref: str, path: str) -> bool:
        validate_key(path)
        try:
            self.stat(ref, path)
        except NotFound:
            # A missing ref is an error, not an absent object (lakeFS answers 404 to both).
            self.resolve(ref)
            return False
        return True

    def list(self, ref: str, prefix: str = "") -> Iterator[ObjectStat]:
        validate_key_prefix(prefix)
        listing = self._resumable(
            f"list {prefix!r} at ref {ref!r}",
            lambda after, remaining: lakefs.Reference(self.name, ref, self._client).objects(
                prefix=prefix or None, after=after, amount=self.page_size
            ),
            key=lambda info: info.path,
        )
        return _eager(_object_stat(info) for info in listing)

    def delete(self, branch: str, path: str) -> None:
        validate_branch(branch)
        validate_key(path)
        target = self._repo.branch(branch).object(path)
        # NotFound now, so that after a lost response an absent object proves the delete worked.
        self.stat(branch, path)
        self._retry.write_once(
            f"delete {path!r} on branch {branch!r}",
            target.delete,
            lambda: None if target.exists() else True,
        )

    # history

    def commit(
        self, branch: str, message: str, metadata: dict[str, str] | None = None, allow_empty: bool = False
    ) -> Commit:
        validate_branch(branch)
        marked, write_id = _marked(metadata)
        commit_id = self._retry.write_once(
            f"commit on branch {branch!r}",
            lambda: self._repo.branch(branch).commit(message, metadata=marked, allow_empty=allow_empty).id,
            lambda: self._find_write(branch, write_id),
        )
        return self.get_commit(commit_id)

    def merge(
        self, source: str, destination: str, message: str = "", metadata: dict[str, str] | None = None
    ) -> str:
        validate_branch(destination)
        marked, write_id = _marked(metadata)
        options = {"metadata": marked, **({"message": message} if message else {})}
        action = f"merge {source!r} into {destination!r}"
        try:
            return self._retry.write_once(
                action,
                lambda: lakefs.Reference(self.name, source, self._client).merge_into(destination, **options),
                lambda: self._find_write(destination, write_id),
            )
        except ConflictFound:
            raise MergeConflict(source, destination, self._conflicting_paths(source, destination)) from None

    def _conflicting_paths(self, source: str, destination: str) -> list[str]:
        """lakeFS reports a conflict without its paths: both sides' changes since the merge base."""
        base = self._merge_base(source, destination)
        theirs = {c.path: c.kind for c in self.diff(base.base_commit_id, base.source_commit_id)}
        ours = {c.path: c.kind for c in self.diff(base.base_commit_id, base.destination_commit_id)}
        both = sorted(theirs.keys() & ours.keys())
        conflicting = []
        for path in both:
            if theirs[path] == ours[path] == "removed":
                continue
            if "removed" not in (theirs[path], ours[path]) and (
                self.stat(base.source_commit_id, path).checksum
                == self.stat(base.destination_commit_id, path).checksum
            ):
                continue
            conflicting.append(path)
        return conflicting or both

    def _merge_base(self, source: str, destination: str) -> lakefs_sdk.FindMergeBaseResult:
        return self._call(
            f"find the merge base of {source!r} and {destination!r}",
            lambda: self._sdk.refs_api.find_merge_base(self.name, source, destination),
        )

    def revert(
        self, branch: str, commit_id: str, parent_number: int = 1, metadata: dict[str, str] | None = None
    ) -> Commit:
        validate_branch(branch)
        if not isinstance(parent_number, int) or parent_number < 1:
            raise InvalidPath(f"parent_number must be a positive integer, not {parent_number!r}")
        marked, write_id = _marked(metadata)
        creation = lakefs_sdk.RevertCreation(
            ref=commit_id,
            parent_number=parent_number,
            commit_overrides=lakefs_sdk.CommitOverrides(metadata=marked),
        )
        self._retry.write_once(
            f"revert {commit_id!r} on branch {branch!r}",
            lambda: self._sdk.branches_api.revert_branch(self.name, branch, creation),
            lambda: self._find_write(branch, write_id),
        )
        revert_id = self._call(
            f"find the revert commit on {branch!r}", lambda: self._find_write(branch, write_id)
        )
        if revert_id is None:
            raise RepoError(
                f"revert of {commit_id!r} succeeded but its commit is no longer on branch {branch!r}"
            )
        return self.get_commit(revert_id)

    def _find_write(self, branch: str, write_id: str) -> str | None:
        """The id of the recent commit on ``branch`` that carries ``write_id``, if any."""
        for commit in lakefs.Reference(self.name, branch, self._client).log(max_amount=_MARKER_SEARCH_DEPTH):
            if (commit.metadata or {}).get(WRITE_ID) == write_id:
                return commit.id
        return None

    def reset_hard(self, branch: str, ref: str) -> None:
        validate_branch(branch)
        commit_id = self.resolve(ref)
        # One call, so the move is atomic; lakeFS keeps the branch's staged changes, as the port says.
        self._call(
            f"hard reset branch {branch!r} to {ref!r}",
            lambda: self._sdk.experimental_api.hard_reset_branch(self.name, branch, commit_id),
        )

    def discard_uncommitted(self, branch: str) -> None:
        validate_branch(branch)
        self._call(
            f"discard uncommitted changes on branch {branch!r}",
            lambda: self._repo.branch(branch).reset_changes("reset"),
        )

    def log(self, ref: str, limit: int | None = None) -> Iterator[Commit]:
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise InvalidPath(f"log limit must be a non-negative integer, not {limit!r}")
        if limit == 0:
            self.resolve(ref)
            return iter(())
        commits = self._resumable(
            f"read the log of {ref!r}",
            lambda after, remaining: lakefs.Reference(self.name, ref, self._client).log(
                max_amount=remaining, after=after, amount=min(self.page_size, remaining or self.page_size)
            ),
            key=lambda commit: commit.id,
            limit=limit,
        )
        return _eager(_port_commit(commit) for commit in commits)

    def get_commit(self, ref: str) -> Commit:
        return _port_commit(self._commit_of(ref))

    def diff(self, left: str, right: str, prefix: str = "") -> list[Change]:
        validate_key_prefix(prefix)
        changes = self._resumable(
            f"diff {left!r} against {right!r}",
            lambda after, remaining: lakefs.Reference(self.name, left, self._client).diff(
                right, prefix=prefix or None, after=after, amount=self.page_size, type="two_dot"
            ),
            key=lambda change: change.path,
        )
        return sorted(
            (Change(path=c.path, kind=c.type) for c in changes if c.path_type == "object"),
            key=lambda c: c.path,
        )

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        ancestor_id, descendant_id = self.resolve(ancestor), self.resolve(descendant)
        if ancestor_id == descendant_id:
            return True
        return self._merge_base(ancestor_id, descendant_id).base_commit_id == ancestor_id

    def _resumable(
        self,
        action: str,
        listing: Callable[[str | None, int | None], Iterator[T]],
        key: Callable[[T], str],
        limit: int | None = None,
    ) -> Iterator[T]:
        """Items of a paginated listing; a failed page is retried from the last item seen."""
        after: str | None = None
        yielded = 0
        failures = 0
        while True:
            remaining = None if limit is None else limit - yielded
            try:
                for item in listing(after, remaining):
                    yield item
                    after, yielded, failures = key(item), yielded + 1, 0
                return
            except Exception as exc:
                error = self._retry.port_error(exc, action)
                if error is None:
                    raise
                if not isinstance(error, TransientError):
                    raise error from exc
                failures += 1
                self._retry.backoff(failures, action, error)


def _marked(metadata: dict[str, str] | None) -> tuple[dict[str, str], str]:
    metadata = validate_metadata(metadata)
    if WRITE_ID in metadata:
        raise InvalidPath(f"commit metadata key {WRITE_ID!r} is reserved by the lakeFS adapter")
    write_id = uuid.uuid4().hex
    return {**metadata, WRITE_ID: write_id}, write_id


def _port_commit(commit: lakefs.Commit | lakefs_sdk.Commit) -> Commit:
    metadata = user_metadata(commit.metadata or {})
    metadata.pop(WRITE_ID, None)
    return Commit(
        id=commit.id,
        parents=tuple(commit.parents),
        message=commit.message,
        metadata=metadata,
        created=float(commit.creation_date),
    )


def _object_stat(info: lakefs.ObjectInfo) -> ObjectStat:
    return ObjectStat(
        path=info.path, size=int(info.size_bytes or 0), checksum=info.checksum, mtime=float(info.mtime)
    )


def _eager(items: Iterator[T]) -> Iterator[T]:
    """Fetch the first page now, so a missing ref raises NotFound at the call, not at first use."""
    first = list(itertools.islice(items, 1))
    return itertools.chain(first, items)
