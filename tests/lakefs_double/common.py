"""What the double's operation handlers share: the call, the reply, errors, JSON shapes, paging."""

from __future__ import annotations

import json
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
from versioning.port import Commit, ObjectStat, validate_repo_name

MAX_PAGE = 1000
DEFAULT_PAGE = 100
COMMITTER = "admin"


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
            "read_only": False,
        }


class RepositoryStore:
    """One LocalRepo per lakeFS repository, under ``backing_dir/<name>/``, plus a JSON sidecar."""

    def __init__(self, backing_dir: Path):
        self.dir = backing_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._repos: dict[str, tuple[LocalRepo, RepoInfo]] = {}
        for sidecar in sorted(self.dir.glob("*.lakefs.json")):
            info = RepoInfo(**json.loads(sidecar.read_text()))
            self._repos[info.name] = (LocalRepo(self.dir / info.name, name=info.name, durable=False), info)

    def get(self, name: str) -> tuple[LocalRepo, RepoInfo]:
        try:
            return self._repos[name]
        except KeyError:
            raise ApiError(404, f"repository {name!r} not found") from None

    def all(self) -> list[RepoInfo]:
        return sorted((info for _, info in self._repos.values()), key=lambda info: info.name)

    def create(self, name: str, storage_namespace: str, default_branch: str) -> RepoInfo:
        validate_repo_name(name)
        with self._lock:
            if name in self._repos:
                raise ApiError(409, "not unique: repository already exists")
            if any(info.storage_namespace == storage_namespace for _, info in self._repos.values()):
                raise ApiError(400, f"storage namespace {storage_namespace!r} already in use")
            repo = LocalRepo(self.dir / name, name=name, durable=False)
            repo.ensure(default_branch)
            info = RepoInfo(name, storage_namespace, default_branch, int(time.time()))
            (self.dir / f"{name}.lakefs.json").write_text(json.dumps(info.__dict__))
            self._repos[name] = (repo, info)
            return info

    def delete(self, name: str) -> None:
        with self._lock:
            repo, _ = self.get(name)
            del self._repos[name]
            (self.dir / f"{name}.lakefs.json").unlink()
            repo.close()
            shutil.rmtree(self.dir / name, ignore_errors=True)


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
        try:
            amount = int(self.arg("amount") or DEFAULT_PAGE)
        except ValueError:
            raise ApiError(400, "amount must be an integer") from None
        return DEFAULT_PAGE if amount <= 0 else min(amount, MAX_PAGE)

    @property
    def repo(self) -> LocalRepo:
        return self.store.get(self.path_params["repository"])[0]

    @property
    def info(self) -> RepoInfo:
        return self.store.get(self.path_params["repository"])[1]

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


def commit_json(commit: Commit) -> dict[str, Any]:
    return {
        "id": commit.id,
        "parents": list(commit.parents),
        "committer": COMMITTER,
        "message": commit.message,
        "creation_date": int(commit.created),
        "meta_range_id": "",
        "metadata": dict(commit.metadata),
    }


def stat_json(stat: ObjectStat, info: RepoInfo) -> dict[str, Any]:
    return {
        "path": stat.path,
        "path_type": "object",
        "physical_address": f"{info.storage_namespace}/data/{stat.checksum}",
        "checksum": stat.checksum,
        "mtime": int(stat.mtime),
        "size_bytes": stat.size,
        "content_type": "application/octet-stream",
        "metadata": {},
    }


def ref_json(name: str, commit_id: str) -> dict[str, str]:
    return {"id": name, "commit_id": commit_id}
