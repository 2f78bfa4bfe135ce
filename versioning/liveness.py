"""Whether a process still runs: the one test for every owner of something left on disk or in a
lock (the local repository's temp files, the shard cache's downloads and readers, a run's
process, the publish lock's holder, the janitor's leftovers).

Imports nothing of ours, so every layer can ask here.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime
from pathlib import Path

# /proc start times are in clock ticks since boot; a process that started this much after its
# owner's recorded start is another process that reused the pid.
_START_SLACK_S = 5.0


def pid_alive(pid: int, started: float | None = None) -> bool:
    """Whether ``pid`` runs on this host. A zombie (killed, not yet reaped) counts as dead; with
    ``started`` (epoch seconds), so does a process that started after it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    stat = _proc_stat(pid)
    if stat is None:
        return True  # no /proc: existence is all we can tell
    state, start = stat
    if state in ("Z", "X"):
        return False
    return not (started is not None and start > started + _START_SLACK_S)


def process_alive(host_pid: str | None, started: datetime | None) -> bool | None:
    """True/False for a ``host:pid`` on this host; None when it cannot be told from here."""
    if not host_pid or ":" not in host_pid:
        return None
    host, _, pid_text = host_pid.rpartition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return None
    return pid_alive(int(pid_text), None if started is None else started.timestamp())


def _proc_stat(pid: int) -> tuple[str, float] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, IndexError, StopIteration, ValueError):
        return None
    return fields[0], boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
