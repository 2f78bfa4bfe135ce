"""What the double's operation handlers share: the call, the reply, errors, JSON shapes, paging."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any, BinaryIO

from tests.lakefs_double.spec import Operation
from versioning.local import LocalRepo
from versioning.port import RESERVED_METADATA_PREFIX, Commit, ObjectStat

MAX_PAGE = 1000
DEFAULT_PAGE = 100
COMMITTER = "admin"
# pkg/validator/validate.go
_REPOSITORY_ID = re.compile(r"^[a-z0-9][a-z0-9-]{2,62}$")


class ApiError(Exception):
    """An error answer: status and the lakeFS-style message."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def not_implemented(what: str) -> ApiError:
    return ApiError(501, f"{what} is not implemented by the tokenlake lakeFS API double")


@dataclass
class Reply:
    status: int
    json: Any = None
    body: bytes | None = None
    stream: BinaryIO | None = None
    length: int = 0  # of ``stream``, or the Content-Length a HEAD answer announces
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RepoInfo:
    name: str
    storage_namespace: str
    default_branch: str
    creation_date: int

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.name,
            "creation_date": self.creation_date,
            "default_branch": self.default_branch,
            "storage_namespace": self.storage_namespace,
            "storage_id": "",  # lakeFS names its (single) blockstore ""
            "read_only": False,
        }


class RepositoryStore:
    """One LocalRepo per lakeFS repository, under ``backing_dir/<name>/``, plus JSON sidecars.

    Beside each repository: ``<name>.lakefs.json`` (its RepoInfo) and
    ``<name>.commit-metadata.json`` (the commit metadata keys in lakeFS's ``.lakefs.``
    namespace, which LocalRepo refuses to store, by commit id). ``storage-namespaces.json``
    lists every namespace ever used: lakeFS leaves its ``_lakefs/dummy`` marker in a
    namespace when a repository is deleted, so the namespace is never reused.
    """

    def __init__(self, backing_dir: Path):
        self.dir = backing_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._etags: dict[str, str] = {}  # LocalRepo checksum -> lakeFS ETag (MD5 hex of the bytes)
        self._generations: dict[str, int] = {}  # commit id -> lakeFS commit generation
        self._repos: dict[str, tuple[LocalRepo, RepoInfo]] = {}
        self._reserved: dict[str, dict[str, dict[str, str]]] = {}
        for sidecar in sorted(self.dir.glob("*.lakefs.json")):
            info = RepoInfo(**json.loads(sidecar.read_text()))
            self._repos[info.name] = (LocalRepo(self.dir / info.name, name=info.name, durable=False), info)
            reserved = self._reserved_path(info.name)
            self._reserved[info.name] = json.loads(reserved.read_text()) if reserved.exists() else {}
        namespaces = self.dir / "storage-namespaces.json"
        self._namespaces: set[str] = set(json.loads(namespaces.read_text())) if namespaces.exists() else set()

    def get(self, name: str) -> tuple[LocalRepo, RepoInfo]:
        if not _REPOSITORY_ID.match(name):
            # The catalog validates the id before it looks (pkg/catalog/catalog.go).
            raise ApiError(400, "argument repository: repository id: invalid value: validation error")
        try:
            return self._repos[name]
        except KeyError:
            raise ApiError(404, f"repository {name!r} not found") from None

    def all(self) -> list[RepoInfo]:
        return sorted((info for _, info in self._repos.values()), key=lambda info: info.name)

    def create(self, name: str, storage_namespace: str, default_branch: str) -> RepoInfo:
        with self._lock:
            if name in self._repos:
                raise ApiError(409, "error creating repository: not unique")
            namespace = storage_namespace.rstrip("/")
            if namespace in self._namespaces:
                raise ApiError(
                    400,
                    f"failed to create repository: found lakeFS objects in the storage (:{storage_namespace}) "
                    "key(_lakefs/dummy): storage namespace already in use",
                )
            repo = LocalRepo(self.dir / name, name=name, durable=False)
            repo.ensure(default_branch)
            info = RepoInfo(name, storage_namespace, default_branch, int(time.time()))
            self._namespaces.add(namespace)
            _write_json(self.dir / "storage-namespaces.json", sorted(self._namespaces))
            _write_json(self.dir / f"{name}.lakefs.json", info.__dict__)
            self._repos[name] = (repo, info)
            self._reserved[name] = {}
            return info

    def delete(self, name: str) -> None:
        with self._lock:
            repo, _ = self.get(name)
            del self._repos[name]
            self._reserved.pop(name, None)
            (self.dir / f"{name}.lakefs.json").unlink()
            self._reserved_path(name).unlink(missing_ok=True)
            repo.close()
            shutil.rmtree(self.dir / name, ignore_errors=True)

    def add_reserved_metadata(self, name: str, commit_id: str, reserved: dict[str, str]) -> None:
        """Record the ``.lakefs.`` keys of a commit the double just made."""
        if not reserved:
            return
        with self._lock:
            self._reserved[name][commit_id] = dict(reserved)
            _write_json(self._reserved_path(name), self._reserved[name])

    def etag(self, repo: LocalRepo, ref: str, stat: ObjectStat) -> str:
        """The object's ETag as lakeFS's S3 and local block adapters give it for a single-part
        upload: the MD5 hex of its bytes (LocalRepo's checksum is a sha256, which no lakeFS sends)."""
        etag = self._etags.get(stat.checksum)
        if etag is None:
            digest = hashlib.md5(usedforsecurity=False)
            with repo.open(ref, stat.path) as stream:
                for block in iter(lambda: stream.read(1 << 20), b""):
                    digest.update(block)
            etag = self._etags.setdefault(stat.checksum, digest.hexdigest())
        return etag

    def generation(self, repo: LocalRepo, commit: Commit) -> int:
        """pkg/graveler/ref: the first commit is generation 1, every other 1 + its parents' highest."""
        pending = [commit]
        while pending:
            current = pending[-1]
            if current.id in self._generations:
                pending.pop()
                continue
            missing = [p for p in current.parents if p not in self._generations]
            if missing:
                pending.extend(repo.get_commit(p) for p in missing)
                continue
            pending.pop()
            self._generations[current.id] = 1 + max(
                (self._generations[p] for p in current.parents), default=0
            )
        return self._generations[commit.id]

    def reserved_metadata(self, name: str, commit_id: str) -> dict[str, str]:
        return dict(self._reserved.get(name, {}).get(commit_id, {}))

    def _reserved_path(self, name: str) -> Path:
        return self.dir / f"{name}.commit-metadata.json"


def _write_json(path: Path, value: Any) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(json.dumps(value, sort_keys=True))
    os.replace(temp, path)


def split_metadata(metadata: Any) -> tuple[dict[str, str], dict[str, str]]:
    """(what LocalRepo stores, the ``.lakefs.`` keys the double keeps beside it)."""
    metadata = dict(metadata or {})
    reserved = {
        k: v for k, v in metadata.items() if isinstance(k, str) and k.startswith(RESERVED_METADATA_PREFIX)
    }
    return {k: v for k, v in metadata.items() if k not in reserved}, reserved


@dataclass
class Call:
    """One request, as an operation handler sees it."""

    op: Operation
    path_params: dict[str, str]
    query: dict[str, list[str]]
    headers: Message
    json_body: Any
    stream: BinaryIO
    store: RepositoryStore

    def arg(self, name: str, default: str | None = None) -> str | None:
        values = self.query.get(name)
        return values[0] if values else default

    def required(self, name: str) -> str:
        value = self.arg(name)
        if value is None or value == "":
            raise ApiError(400, f"{name} is required")
        return value

    def flag(self, name: str) -> bool:
        return (self.arg(name) or "false").lower() == "true"

    def amount(self) -> int:
        """lakeFS's paginationAmount (pkg/api/controller.go); the spec validator bounds it first."""
        amount = int(self.arg("amount") or DEFAULT_PAGE)
        return DEFAULT_PAGE if amount <= 0 else min(amount, MAX_PAGE)

    @property
    def repo(self) -> LocalRepo:
        return self.store.get(self.path_params["repository"])[0]

    @property
    def info(self) -> RepoInfo:
        return self.store.get(self.path_params["repository"])[1]

    def commit_json(self, commit: Commit) -> dict[str, Any]:
        """The commit as lakeFS answers it, with the ``.lakefs.`` keys the double keeps aside."""
        reserved = self.store.reserved_metadata(self.path_params["repository"], commit.id)
        return commit_json(commit, self.store.generation(self.repo, commit), reserved)

    def stat_json(self, stat: ObjectStat, ref: str, *, listed: bool = False) -> dict[str, Any]:
        return stat_json(stat, self.info, self.store.etag(self.repo, ref, stat), listed=listed)

    def remember_reserved(self, commit_id: str, reserved: dict[str, str]) -> None:
        self.store.add_reserved_metadata(self.path_params["repository"], commit_id, reserved)

    def body_field(self, name: str, default: Any = None) -> Any:
        body = self.json_body if isinstance(self.json_body, dict) else {}
        return body.get(name, default)


Handler = Callable[[Call], Reply]
OPERATIONS: dict[str, Handler] = {}


def operation(operation_id: str) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        OPERATIONS[operation_id] = handler
        return handler

    return register


def page(items: Iterable[Any], key: Callable[[Any], str], after: str, amount: int) -> dict[str, Any]:
    """A lakeFS listing page: items strictly after ``after`` (by key), ``amount`` of them."""
    results: list[Any] = []
    has_more = False
    for item in items:
        if after and key(item) <= after:
            continue
        if len(results) == amount:
            has_more = True
            break
        results.append(item)
    return {
        "pagination": {
            "has_more": has_more,
            "next_offset": key(results[-1]) if has_more else "",
            "results": len(results),
            "max_per_page": MAX_PAGE,
        },
        "results": results,
    }


def after_marker(items: Iterator[Any], key: Callable[[Any], str], marker: str) -> Iterator[Any]:
    """The items after the one whose key is ``marker`` (log pages are not sorted by key)."""
    if not marker:
        yield from items
        return
    seen = False
    for item in items:
        if seen:
            yield item
        elif key(item) == marker:
            seen = True


def commit_json(commit: Commit, generation: int, reserved: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "id": commit.id,
        "parents": list(commit.parents),
        "committer": COMMITTER,
        "message": commit.message,
        "creation_date": int(commit.created),
        "meta_range_id": "",
        "metadata": {**commit.metadata, **(reserved or {})},
        "generation": generation,
        "version": 1,  # graveler.CurrentCommitVersion
    }


def stat_json(stat: ObjectStat, info: RepoInfo, etag: str, *, listed: bool = False) -> dict[str, Any]:
    """An ObjectStats; a ``listed`` one (an entry of listObjects) carries no metadata map, as
    lakeFS lists an object without user metadata without one (statObject sends ``{}``)."""
    found = {
        "path": stat.path,
        "path_type": "object",
        "physical_address": f"{info.storage_namespace}/data/{stat.checksum}",
        "checksum": etag,
        "mtime": int(stat.mtime),
        "size_bytes": stat.size,
        "content_type": "application/octet-stream",
        "metadata": {},
    }
    if listed:
        del found["metadata"]
    return found


def ref_json(name: str, commit_id: str) -> dict[str, str]:
    return {"id": name, "commit_id": commit_id}
