"""A full disk, said in one sentence: which path, how much was needed, how much is free.

Every writer of tokenlake (the local repository's objects, shard files, checkpoints, lineage
records) turns an ``OSError`` that means "no room" into :class:`DiskFull` (or its own error
type) with :func:`disk_full_message`, after removing what it had half written. "No room" is
``ENOSPC`` (the file system is full), ``EDQUOT`` (a quota) or ``EFBIG`` (a file-size limit
such as ``ulimit -f``, which the message then names).
"""

from __future__ import annotations

import errno
import os
import resource
from pathlib import Path

from versioning.port import RepoError

_NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class DiskFull(RepoError):
    """A write failed for lack of space; the message names the path and the space needed."""


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _NO_ROOM


def free_bytes(path: Path | str) -> int | None:
    """Bytes available to this user on the file system holding ``path`` (its nearest existing parent)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        stats = os.statvfs(probe)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def file_size_limit() -> int | None:
    """This process's maximum file size (``ulimit -f``), or None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else soft


def human(size: int) -> str:
    value = float(size)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{size} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def disk_full_message(what: str, path: Path | str, needed: int | None, written: int = 0) -> str:
    """One sentence: ``what`` could not be written to ``path`` for lack of space, and how much it needs.

    ``needed`` is the size of the whole write when known; otherwise the message says it needs
    more than the ``written`` bytes that fitted."""
    free = free_bytes(path)
    need = (
        f"it needs {human(needed)}"
        if needed is not None
        else f"it needs more than the {human(written)} written"
    )
    room = f"{human(free)} free on that file system" if free is not None else "the free space is unknown"
    limit = file_size_limit()
    capped = f", and files are limited to {human(limit)} (ulimit -f)" if limit is not None else ""
    return f"no space left to write {what} {path}: {need}, {room}{capped}; free space and run again"
