"""What a curate run leaves to look at: a table per stage, a progress bar, a markdown summary.

The same events also reach in-process listeners (the CLI's console progress display), so a
run from the shell and a run watched in the Prefect UI show the same progress.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from prefect.artifacts import create_markdown_artifact, create_progress_artifact, create_table_artifact
from prefect.artifacts import update_progress_artifact as _update_progress

from tasks.stage import StageResult


@dataclass(frozen=True)
class StageEvent:
    """A stage started (``result`` None) or finished; ``reused`` when its output came from the cache."""

    stage: str
    index: int  # 1-based position in the chain
    total: int
    result: StageResult | None = None
    reused: bool = False


Listener = Callable[[StageEvent], None]
_listeners: list[Listener] = []
_listeners_lock = threading.Lock()


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Receive the stage events of flows run in this process while the block runs."""
    with _listeners_lock:
        _listeners.append(listener)
    try:
        yield
    finally:
        with _listeners_lock:
            _listeners.remove(listener)


def _notify(event: StageEvent) -> None:
    with _listeners_lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(event)


class RunProgress:
    """The run's progress artifact (percent of stages done) plus in-process listeners."""

    def __init__(self, stages: Sequence[str]):
        self.stages = stages
        self.artifact_id: UUID = create_progress_artifact(
            0.0, key="curate-progress", description=f"curate: 0 of {len(stages)} stages"
        )

    def started(self, stage: str) -> None:
        """Listeners only: the artifact moves when a stage ends (each update is an API call)."""
        _notify(StageEvent(stage, self.stages.index(stage) + 1, len(self.stages)))

    def finished(self, result: StageResult, reused: bool) -> None:
        index = self.stages.index(result.stage) + 1
        _notify(StageEvent(result.stage, index, len(self.stages), result, reused))
        self._update(index, f"curate: {result.stage} {'reused' if reused else 'done'} ({index} of {len(self.stages)})")

    def _update(self, done: int, description: str) -> None:
        _update_progress(self.artifact_id, 100.0 * done / len(self.stages), description=description)


def stage_row(result: StageResult, reused: bool) -> dict[str, Any]:
    """Documents in, kept, quarantined by reason, tokens, seconds and commit of one stage."""
    r = result.report
    rejected = r.get("rejected") or {}
    return {
        "stage": result.stage,
        "documents in": r.get("documents_in", 0),
        "kept": r.get("kept", 0),
        "quarantined": sum(rejected.values()),
        "quarantined by reason": ", ".join(f"{k}: {v}" for k, v in sorted(rejected.items())) or "-",
        "tokens": r.get("tokens", 0),
        "seconds": round(float(r.get("seconds", 0.0)), 2),
        "commit": result.commit_id,
        "ran": "reused" if reused else "ran",
    }


def stages_table(done: list[tuple[StageResult, bool]]) -> None:
    """One table for the run (each stage task leaves its own per-source table when it runs)."""
    create_table_artifact(
        [stage_row(result, reused) for result, reused in done],
        key="curate-stages",
        description="curate stages: documents in / kept / quarantined by reason, tokens, seconds",
    )


@dataclass(frozen=True)
class SummaryLinks:
    data_docs: dict[str, str] = field(default_factory=dict)  # stage -> Great Expectations Data Docs
    lakefs_ui: str | None = None  # lakeFS UI base URL (lakeFS repositories only)
    repository: str = ""


def summary_markdown(
    published: Any, branch: str, results: list[tuple[StageResult, bool]], links: SummaryLinks
) -> str:
    lines = [f"# curate: {published}", "", f"Run branch `{branch}`, repository `{links.repository}`.", ""]
    rows = [stage_row(result, reused) for result, reused in results]
    if rows:
        lines += ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        lines += ["| " + " | ".join(str(v) for v in row.values()) + " |" for row in rows]
    lines += ["", f"Dataset version: tag `{published.tag}`, commit `{published.commit_id}`."]
    for stage, url in links.data_docs.items():
        lines.append(f"Great Expectations Data Docs of {stage}: {url}")
    if links.lakefs_ui:
        lines.append(f"lakeFS: {links.lakefs_ui}/repositories/{links.repository}/commits/{published.commit_id}")
    return "\n".join(lines) + "\n"


def summary(published: Any, branch: str, results: list[tuple[StageResult, bool]], links: SummaryLinks) -> str:
    text = summary_markdown(published, branch, results, links)
    create_markdown_artifact(text, key="curate-summary", description=str(published))
    return text
