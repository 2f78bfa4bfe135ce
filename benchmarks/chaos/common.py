"""Shared by the chaos campaigns: process trees, SIGKILLs of whole jobs, results files."""

from __future__ import annotations

import json
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.training.helpers import children  # noqa: E402  (the campaigns kill what the tests kill)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first, then theirs)."""
    found, frontier = [], [pid]
    while frontier:
        kids = [c for p in frontier for c in children(p)]
        found += kids
        frontier = kids
    return found


def kill_tree(pid: int) -> list[int]:
    """SIGKILL ``pid`` and everything below it at (nearly) the same moment.

    torchrun starts each worker in a session of its own, so a process-group kill misses
    them: ``pid`` is stopped first (a stopped process cannot fork), then its tree is read
    and every process in it killed."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return []
    tree = descendants(pid)
    for target in [*tree, pid]:
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return tree


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def machine() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "loadavg_at_start": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
    }


def write_results(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"chaos_{name}.json"
    payload = {**payload, "loadavg_at_end": " ".join(Path("/proc/loadavg").read_text().split()[:3])}
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    return path
