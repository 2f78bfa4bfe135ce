"""Lineage records on branch ``runs`` of the dataset repository, written without blocking training.

Every record is first written to a queue directory on local disk (atomically), then a
background thread commits the queued records to the repository: one JSON object per
record at ``runs/<run>/checkpoints/step-NNNNNNN.json`` (after each checkpoint) or
``runs/<run>/events/<kind>-step-NNNNNNN.json`` (rollbacks, a resume on other data). If
the repository is unreachable the records stay queued and are retried with backoff; a
later run of the same name picks up what an earlier one could not write.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from formats.layout import LINEAGE_BRANCH, MAIN
from versioning import Conflict, DataRepo, DiskFull, NoChanges, RepoError
from versioning.diskspace import disk_full_message, is_disk_full

_MAX_RETRY_SECONDS = 60.0


class LineageWriter:
    """Queue on disk, commit in the background; ``close`` gives the queue one last try."""

    def __init__(
        self,
        open_repo: Callable[[], DataRepo],
        run: str,
        queue_dir: Path,
        retry_seconds: float = 2.0,
        warn: Callable[[str], None] = print,
    ):
        self._open_repo = open_repo
        self._repo: DataRepo | None = None
        self.run = run
        self.queue_dir = queue_dir
        self.retry_seconds = retry_seconds
        self._warn = warn
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one flush at a time (background thread or close)
        self._failing = False
        self._thread: threading.Thread | None = None
        queue_dir.mkdir(parents=True, exist_ok=True)

    def start(self) -> LineageWriter:
        self._thread = threading.Thread(target=self._run, name="lineage-writer", daemon=True)
        self._thread.start()
        return self

    def record(self, repo_path: str, record: dict[str, Any], if_absent: bool = False) -> None:
        """Queue ``record`` for ``repo_path`` (never touches the repository on the caller's thread).

        ``if_absent``: written only where ``runs`` has no record at that path yet. For a record
        queued again in case it was lost: one already there may say more (a forked
        checkpoint's record names its run and where it was forked from; its files do not)."""
        entry = {"path": repo_path, "record": record, **({"if_absent": True} if if_absent else {})}
        body = json.dumps(entry, indent=2, sort_keys=True, default=str)
        name = f"{time.time_ns():020d}-{os.getpid()}.json"
        tmp = self.queue_dir / f".{name}.tmp"
        try:
            tmp.write_text(body)
            os.replace(tmp, self.queue_dir / name)
        except OSError as exc:
            tmp.unlink(missing_ok=True)  # the queue only ever holds whole records
            if is_disk_full(exc):
                raise DiskFull(
                    disk_full_message(
                        f"the lineage record {repo_path} to", self.queue_dir, len(body.encode())
                    )
                ) from None
            raise
        self._wake.set()

    def pending(self) -> list[Path]:
        return sorted(self.queue_dir.glob("*.json"))

    def flush(self) -> bool:
        """Commit every queued record now; True when the queue is empty afterwards."""
        with self._lock:
            queued = self.pending()
            if not queued:
                return True
            try:
                repo = self._repo = self._repo or self._open_repo()
                _ensure_branch(repo)
                entries = [json.loads(p.read_text()) for p in queued]
                queued_paths = {e["path"] for e in entries if not e.get("if_absent")}
                entries = [
                    e for e in entries
                    if not e.get("if_absent") or not (e["path"] in queued_paths or repo.exists(LINEAGE_BRANCH, e["path"]))
                ]  # fmt: skip
                for entry in entries:
                    data = (json.dumps(entry["record"], indent=2, sort_keys=True) + "\n").encode()
                    repo.put(LINEAGE_BRANCH, entry["path"], data)
                steps = sorted({str(e["record"].get("step", "")) for e in entries})
                try:
                    repo.commit(
                        LINEAGE_BRANCH,
                        f"lineage: run {self.run}, {len(entries)} record(s), step(s) {', '.join(steps)}",
                        {"kind": "lineage", "run": self.run},
                    )
                except NoChanges:  # the same records were committed before (a replayed step)
                    pass
            except (RepoError, OSError) as exc:
                self._repo = None  # reconnect next time
                if not self._failing:
                    trouble = (
                        "repository out of space" if isinstance(exc, DiskFull) else "repository unreachable"
                    )
                    self._warn(f"lineage: {trouble}, {len(queued)} record(s) queued ({exc})")
                self._failing = True
                return False
            for path in queued:
                path.unlink(missing_ok=True)
            if self._failing:
                self._warn("lineage: repository reachable again, queued records written")
            self._failing = False
            return not self.pending()

    def _run(self) -> None:
        delay = self.retry_seconds
        while not self._stop.is_set():
            self._wake.wait(timeout=delay)
            self._wake.clear()
            if self._stop.is_set():
                break
            delay = self.retry_seconds if self.flush() else min(delay * 2, _MAX_RETRY_SECONDS)

    def close(self) -> bool:
        """Stop the thread and try once more; True when nothing is left queued."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        done = self.flush()
        if not done:
            self._warn(
                f"lineage: {len(self.pending())} record(s) stay queued in {self.queue_dir}; "
                "the next run of this name writes them"
            )
        return done


def _ensure_branch(repo: DataRepo) -> None:
    if LINEAGE_BRANCH in repo.list_branches():
        return
    try:
        repo.create_branch(LINEAGE_BRANCH, MAIN)
    except Conflict:  # created meanwhile by another run
        pass
