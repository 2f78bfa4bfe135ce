"""One trainer per run name: an exclusive ``flock`` on ``<run>/.lock``, held by rank 0.

The kernel drops a ``flock`` when its process dies, however it dies (a SIGKILL, the OOM
killer), so a dead trainer never holds a run; no stale-lock clean-up is needed. The file
also names the holder (host, pid, start time, flow run), which a second trainer's refusal
quotes.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from datetime import UTC, datetime
from pathlib import Path

from training.errors import TrainingError

LOCK_FILE = ".lock"


class RunBusy(TrainingError):
    """Another live trainer holds the run; the message names it."""


class RunLock:
    def __init__(self, run_dir: Path, run: str, flow_run_id: str = ""):
        self.path = run_dir / LOCK_FILE
        self.run = run
        self.flow_run_id = flow_run_id
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock or raise :class:`RunBusy` naming the holder; never waits."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunBusy(
                f"run {self.run!r} is being trained by another process ({_describe(holder)}); wait for it "
                "to finish or stop it, or choose another run name"
            ) from None
        holder = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": datetime.now(UTC).isoformat(timespec="seconds"),
            "flow_run_id": self.flow_run_id,
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None

    __del__ = release  # a trainer that failed half-way through its construction lets go too


def _read_holder(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, json.JSONDecodeError):
        return {}  # the holder has the lock but has not written its name yet


def _describe(holder: dict) -> str:
    if not holder:
        return "holder not yet recorded"
    text = f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')}"
    return text + (f", flow run {holder['flow_run_id']}" if holder.get("flow_run_id") else "")
