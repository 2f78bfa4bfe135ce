"""Versioned dataset storage: the DataRepo port and its adapters. Imports nothing of ours."""

from __future__ import annotations

import os
from pathlib import Path

from versioning.diskspace import DiskFull
from versioning.port import (
    Change,
    Commit,
    Conflict,
    DataRepo,
    InvalidPath,
    MergeConflict,
    NoChanges,
    NotFound,
    ObjectStat,
    RepoError,
    TransientError,
    validate_branch,
    validate_key,
    validate_path,
    validate_tag,
)

__all__ = [
    "Change",
    "Commit",
    "Conflict",
    "DataRepo",
    "DiskFull",
    "InvalidPath",
    "MergeConflict",
    "NoChanges",
    "NotFound",
    "ObjectStat",
    "RepoError",
    "TransientError",
    "data_home",
    "open_repo",
    "validate_branch",
    "validate_key",
    "validate_path",
    "validate_tag",
]


def data_home() -> Path:
    """Where tokenlake keeps local state: ``$TOKENLAKE_HOME``, else ``./.tokenlake``."""
    return Path(os.environ.get("TOKENLAKE_HOME") or Path.cwd() / ".tokenlake").resolve()


def open_repo(spec: str | None = None, *, create: bool = True) -> DataRepo:
    """Open the dataset repository named by ``spec``.

    ``spec`` is ``lakefs://<repository>`` (configured the lakectl way) or a local
    directory; default ``$TOKENLAKE_REPO``, else ``<data home>/repo``.
    """
    spec = spec or os.environ.get("TOKENLAKE_REPO") or str(data_home() / "repo")
    if spec.startswith("lakefs://"):
        from versioning.lakefs import LakeFSRepo

        repo: DataRepo = LakeFSRepo.from_lakectl(spec.removeprefix("lakefs://").strip("/"))
    else:
        from versioning.local import LocalRepo

        repo = LocalRepo(Path(spec.removeprefix("local://")))
    if create:
        repo.ensure()
    return repo
