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
    HookFailed,
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
    "HookFailed",
    "InvalidPath",
    "MergeConflict",
    "NoChanges",
    "NotFound",
    "ObjectStat",
    "RepoError",
    "TransientError",
    "data_home",
    "default_repo_spec",
    "open_repo",
    "validate_branch",
    "validate_key",
    "validate_path",
    "validate_tag",
]


def data_home() -> Path:
    """Where tokenlake keeps local state: ``$TOKENLAKE_HOME``, else ``./.tokenlake``."""
    return Path(os.environ.get("TOKENLAKE_HOME") or Path.cwd() / ".tokenlake").resolve()


def default_repo_spec() -> str:
    """The repository used when none is named: ``$TOKENLAKE_REPO``, else ``<data home>/repo``.

    The one place that decides it: the CLI, the flows and the trainer all ask here, so a run
    never resolves a dataset in one repository and trains from another.
    """
    return os.environ.get("TOKENLAKE_REPO") or str(data_home() / "repo")


def open_repo(spec: str | None = None, *, create: bool = True) -> DataRepo:
    """Open the dataset repository named by ``spec``.

    ``spec`` is ``lakefs://<repository>`` (configured the lakectl way) or a local
    directory; default :func:`default_repo_spec`.
    """
    spec = spec or default_repo_spec()
    if spec.startswith("lakefs://"):
        from versioning.lakefs import LakeFSRepo

        repo: DataRepo = LakeFSRepo.from_lakectl(spec.removeprefix("lakefs://").strip("/"))
    else:
        from versioning.local import LocalRepo

        repo = LocalRepo(Path(spec.removeprefix("local://")))
    if create:
        repo.ensure()
    return repo
