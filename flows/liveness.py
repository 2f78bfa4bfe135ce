"""Whether a process named by ``host:pid`` still runs: how the janitor judges a run's process,
and how a publisher judges the publish lock's holder (:func:`flows.wap.publish_lock`)."""

from __future__ import annotations

import os
import socket
from datetime import datetime
from pathlib import Path


def process_alive(infrastructure_pid: str | None, started: datetime | None) -> bool | None:
    """True/False for a ``host:pid`` on this host; None when it cannot be told from here."""
    if not infrastructure_pid or ":" not in infrastructure_pid:
        return None
    host, _, pid_text = infrastructure_pid.rpartition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return None
    pid = int(pid_text)
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
        return False  # killed, not yet reaped
    # A process that started after the run did is another process that reused the pid.
    return not (started is not None and start is not None and start > started.timestamp() + 5)


def _proc_stat(pid: int) -> tuple[str, float | None] | None:
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
