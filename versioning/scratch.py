"""Scratch files and folders named after their owner, so that what a killed process left behind
can be told from what a live one still uses.

A name is ``tokenlake-<kind>-<host>-<pid>-<made>-<rest>``: ``host`` a short hash of the hostname
(a hostname may hold any character), ``pid`` the owner, ``made`` the second the name was made,
so a later process that reused the pid is not taken for the owner. A SIGKILL runs no cleanup:
the next start of the same kind of work calls :func:`sweep` on its folder, which removes the
entries of this host whose owner is dead, never a live owner's and never another host's (they
cannot be judged from here); ``tokenlake janitor`` lists them all (:func:`leftovers`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from versioning.liveness import pid_alive

HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]
_PREFIX = "tokenlake-"


def owned_prefix(kind: str) -> str:
    """The start of a scratch name owned by this process (``kind`` names the work, e.g. ``loader``)."""
    return f"{_PREFIX}{kind}-{HOST}-{os.getpid()}-{int(time.time())}-"


@dataclass(frozen=True)
class Leftover:
    path: Path
    kind: str
    pid: int
    bytes: int


def leftovers(directory: Path, kind: str | None = None) -> Iterator[Leftover]:
    """The scratch entries in ``directory`` (of ``kind``, or any) that this host's dead processes own."""
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return
    marker = f"-{HOST}-"
    for entry in entries:
        name = entry.name
        if not name.startswith(_PREFIX) or marker not in name:
            continue
        found_kind, _, owner = name[len(_PREFIX) :].partition(marker)
        pid, _, rest = owner.partition("-")
        made = rest.partition("-")[0]
        if (kind is not None and found_kind != kind) or not pid.isdigit() or not made.isdigit():
            continue
        if pid_alive(int(pid), started=float(made)):
            continue
        yield Leftover(Path(entry.path), found_kind, int(pid), _size(entry))


def sweep(directory: Path, kind: str) -> list[Leftover]:
    """Remove what this host's dead processes left of ``kind`` in ``directory``; returns it."""
    removed = []
    for leftover in leftovers(directory, kind):
        remove(leftover)
        removed.append(leftover)
    return removed


def remove(leftover: Leftover) -> None:
    with contextlib.suppress(FileNotFoundError):  # another sweep got there first
        if leftover.path.is_dir() and not leftover.path.is_symlink():
            shutil.rmtree(leftover.path, ignore_errors=True)
        else:
            leftover.path.unlink()


def _size(entry: os.DirEntry) -> int:
    try:
        if not entry.is_dir(follow_symlinks=False):
            return entry.stat(follow_symlinks=False).st_size
        return sum(
            os.lstat(os.path.join(folder, name)).st_size
            for folder, _, names in os.walk(entry.path)
            for name in names
        )
    except OSError:  # removed meanwhile
        return 0
