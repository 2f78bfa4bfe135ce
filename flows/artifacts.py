"""What a curate run leaves to look at: a table per stage, a progress bar, a markdown summary.

The same events also reach in-process listeners (the CLI's console progress display), so a
run from the shell and a run watched in the Prefect UI show the same progress.

Cells never hold a lone ``-``: Prefect renders table and markdown artifacts as Markdown,
where it is a list bullet. Nothing to say is ``none``; a count a stage does not keep is empty.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from prefect.artifacts import create_markdown_artifact, create_progress_artifact, create_table_artifact
from prefect.artifacts import update_progress_artifact as _update_progress

from flows.listeners import Listeners
from formats import layout
from tasks.stage import StageResult
from tasks.stage_task import top_reasons

SHORT_ID = 12


@dataclass(frozen=True)
class StageRun:
    """A stage of this run: its result, whether it was reused, and (if so) the run that computed it."""

    result: StageResult
    reused: bool = False
    computed_by: str = ""


@dataclass(frozen=True)
class StageEvent:
    """A stage started (``run`` None) or finished, on the run branch ``branch``."""

    stage: str
    index: int  # 1-based position in the chain
    total: int
    branch: str = ""
    run: StageRun | None = None

    @property
    def result(self) -> StageResult | None:
        return self.run.result if self.run else None

    @property
    def reused(self) -> bool:
        return bool(self.run and self.run.reused)


Listener = Callable[[StageEvent], None]
_stage_events = Listeners()


def listening(listener: Listener) -> AbstractContextManager[None]:
    """Receive the stage events of flows run in this process while the block runs."""
    return _stage_events.listening(listener)


def _notify(event: StageEvent) -> None:
    _stage_events.send(event)


class RunProgress:
    """The run's progress artifact (percent of stages done) plus in-process listeners."""

    def __init__(self, stages: Sequence[str], branch: str = ""):
        self.stages = stages
        self.branch = branch
        self.artifact_id: UUID = create_progress_artifact(
            0.0, key="curate-progress", description=f"curate: 0 of {len(stages)} stages"
        )

    def started(self, stage: str) -> None:
        """Listeners only: the artifact moves when a stage ends (each update is an API call)."""
        _notify(StageEvent(stage, self.stages.index(stage) + 1, len(self.stages), self.branch))

    def finished(self, run: StageRun) -> None:
        stage = run.result.stage
        index = self.stages.index(stage) + 1
        _notify(StageEvent(stage, index, len(self.stages), self.branch, run))
        self._update(
            index, f"curate: {stage} {'reused' if run.reused else 'done'} ({index} of {len(self.stages)})"
        )

    def _update(self, done: int, description: str) -> None:
        _update_progress(self.artifact_id, 100.0 * done / len(self.stages), description=description)


def counts_documents(result: StageResult) -> bool:
    """Whether the stage reads documents (mix reads the manifest: its document counts are not kept)."""
    per_source = result.report.get("per_source") or {}
    return not per_source or any("documents_in" in stats for stats in per_source.values())


def produced(result: StageResult) -> str:
    """What the stage's output holds, in words with units: documents, sequences, samples."""
    report = result.report
    extra = report.get("extra") or {}
    if result.stage in layout.DOCUMENTS:
        return f"{report.get('kept', 0):,} documents in {layout.DOCUMENTS[result.stage]}/"
    if "total_samples" in extra:
        return f"a plan of {extra['total_samples']:,} samples ({report.get('tokens', 0):,} tokens) in {layout.MIX}"
    if "sequences" in extra:
        ending = extra.get("documents_in_shards")
        ends = f"; {ending:,} documents end in them" if ending is not None else ""
        return f"{report.get('tokens', 0):,} tokens in {extra['sequences']:,} sequences{ends}"
    return report.get("note") or "none"


def stage_row(run: StageRun) -> dict[str, Any]:
    """Documents in, kept, quarantined by reason, what it produced, seconds this run, commit."""
    result, report = run.result, run.result.report
    rejected = report.get("rejected") or {}
    documents = counts_documents(result)
    seconds = round(float(report.get("seconds", 0.0)), 2)
    if run.reused:
        by = f"run {run.computed_by}" if run.computed_by else "an earlier run"
        ran = f"reused (computed in {seconds:.1f} s by {by})"
    else:
        ran = "ran"
    return {
        "stage": result.stage,
        "documents in": report.get("documents_in", 0) if documents else None,
        "kept": report.get("kept", 0) if documents else None,
        "quarantined": sum(rejected.values()) if documents else None,
        "quarantined by reason": (", ".join(f"{k}: {v}" for k, v in sorted(rejected.items())) or "none")
        if documents
        else None,
        "produced": produced(result),
        "tokens": report.get("tokens", 0),
        "seconds": 0.0 if run.reused else seconds,
        "ran": ran,
        "commit": result.commit_id,
    }


def compact_row(run: StageRun) -> dict[str, Any]:
    """A stage as a row narrow enough to read beside the others: the long text (every
    reason, what it produced, the run it was reused from, the full commit) is in
    :func:`detail_rows`."""
    row = stage_row(run)
    documents = row["quarantined"] is not None
    return {
        "stage": row["stage"],
        "documents in": row["documents in"],
        "kept": row["kept"],
        "quarantined": row["quarantined"],
        "top reasons": top_reasons(run.result.report.get("rejected") or {}) if documents else None,
        "tokens": row["tokens"],
        "seconds": row["seconds"],
        "ran": "reused" if run.reused else "ran",
        "commit": row["commit"][:SHORT_ID],
    }


def detail_rows(done: list[StageRun]) -> list[dict[str, Any]]:
    """The long text of the stages table, one fact per row: what each stage produced, where a
    reused stage was computed, each quarantine reason with its count, the full commit."""
    rows = []
    for run in done:
        row = stage_row(run)
        facts = [("produced", row["produced"])]
        if run.reused:
            facts.append(("ran", row["ran"]))
        rejected = run.result.report.get("rejected") or {}
        facts += [
            (f"quarantined: {reason}", n) for reason, n in sorted(rejected.items(), key=lambda kv: -kv[1])
        ]
        facts.append(("commit", row["commit"]))
        rows += [{"stage": row["stage"], "detail": detail, "value": value} for detail, value in facts]
    return rows


def _cell(value: Any) -> str:
    return "" if value is None else str(value).replace("|", "\\|")


def _cells(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [{k: _cell(v) for k, v in row.items()} for row in rows]


def stages_table(done: list[StageRun]) -> None:
    """Two tables for the run (each stage task leaves its own per-source table when it runs):
    one row per stage, and the long text of each stage, one fact per row."""
    create_table_artifact(
        _cells([compact_row(run) for run in done]),
        key="curate-stages",
        description="curate stages: documents in / kept / quarantined (the top reasons), tokens, seconds this "
        "run (0 when reused), commit; every reason and what each stage produced: curate-stage-details",
    )
    create_table_artifact(
        _cells(detail_rows(done)),
        key="curate-stage-details",
        description="curate stages, one fact per row: what each produced, the run a reused stage was "
        "computed by, each quarantine reason, the full commit",
    )


@dataclass(frozen=True)
class SummaryLinks:
    data_docs: dict[str, str] = field(default_factory=dict)  # stage -> Great Expectations Data Docs
    lakefs_ui: str | None = None  # lakeFS UI base URL (lakeFS repositories only)
    repository: str = ""
    funnel: str | None = None  # the funnel PNG on this machine


def summary_markdown(published: Any, branch: str, done: list[StageRun], links: SummaryLinks) -> str:
    state = "published" if published.new else "already published"
    lines = [
        f"# curate: {state} {published.tag} at {published.commit_id[:SHORT_ID]}",
        "",
        f"Dataset version: tag `{published.tag}`, commit `{published.commit_id}`.",
        "",
        f"Run branch `{branch}`, repository `{links.repository}`.",
        "",
    ]
    rows = [compact_row(run) for run in done]
    if rows:
        columns = [c for c in rows[0] if c != "commit"]
        lines += ["| " + " | ".join(columns) + " | commit |", "|" + "---|" * (len(columns) + 1)]
        lines += [
            "| " + " | ".join(_cell(row[c]) for c in columns) + f" | `{row['commit']}` |" for row in rows
        ]
        lines += [
            "",
            "Every quarantine reason and what each stage produced: the `curate-stage-details` table.",
        ]
    if links.data_docs:
        lines += ["", "Great Expectations Data Docs (each stage's gate):", ""]
        lines += [f"- [{stage}]({url}) `{url}`" for stage, url in links.data_docs.items()]
        if any(url.startswith("file://") for url in links.data_docs.values()):
            lines += [
                "",
                "Browsers do not open `file://` links from a web page: copy the path into the address bar.",
            ]
    if links.funnel:
        lines += [
            "",
            f"Documents and tokens per source through the stages: `{links.funnel}` (the `curate-funnel` artifact).",
        ]
    if links.lakefs_ui:
        url = f"{links.lakefs_ui}/repositories/{links.repository}/commits/{published.commit_id}"
        lines += ["", f"lakeFS: [{published.tag}]({url})"]
    return "\n".join(lines) + "\n"


def summary(published: Any, branch: str, done: list[StageRun], links: SummaryLinks) -> str:
    text = summary_markdown(published, branch, done, links)
    create_markdown_artifact(
        text, key="curate-summary", description=f"{published.tag} at {published.commit_id[:SHORT_ID]}"
    )
    return text
