"""The Prefect side of every stage: the retry policy, the logger, the table artifact, and
:func:`run_stage_task`, the body of each thin ``<stage>_task``."""

from __future__ import annotations

import logging
from typing import Any

from prefect.artifacts import create_table_artifact
from prefect.context import TaskRunContext
from prefect.logging import get_run_logger
from prefect.tasks import exponential_backoff

from tasks.stage import StageFunction, StageResult, run_stage
from versioning import TransientError, open_repo


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry storage hiccups only, never bad input, a misconfiguration or a failed gate."""
    try:
        state.result()
    except (TransientError, ConnectionError, TimeoutError):
        return True
    except BaseException:
        return False
    return False


# every task that talks to the repository (stages, branch and publish tasks): Prefect's
# exponential backoff (1, 2, 4, 8 s) with jitter, so many runs retrying one lakeFS do not
# retry in step
IO_RETRIES: dict[str, Any] = {
    "retries": 4,
    "retry_delay_seconds": exponential_backoff(backoff_factor=1),
    "retry_jitter_factor": 0.5,
    "retry_condition_fn": retry_transient,
}


def stage_logger(name: str) -> logging.Logger | logging.LoggerAdapter:
    """The Prefect run logger inside a task run; the module's logger when called as ``task.fn``."""
    return get_run_logger() if TaskRunContext.get() else logging.getLogger(name)


def top_reasons(rejected: dict[str, int], shown: int | None = 3) -> str:
    """Quarantine reasons, the most frequent first: the first ``shown`` (all if None), then how
    many more there are."""
    ranked = sorted(rejected.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{reason}: {n}" for reason, n in ranked[:shown])
    more = len(ranked) - len(ranked[:shown])
    return (text + (f", +{more} more" if more else "")) or "none"


def _cells(stats: dict[str, Any]) -> dict[str, Any]:
    """A source's report entry as table cells: rejected (the count and the top reasons, so the
    table stays narrow however many reasons there are), scalars, lists joined."""
    cells: dict[str, Any] = {}
    for key, value in stats.items():
        if key == "rejected":
            cells |= {"rejected": sum(value.values()), "top reasons": top_reasons(value)}
        elif isinstance(value, list):
            cells[key] = ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
        elif not isinstance(value, dict):
            cells[key] = value
    return cells


def stage_table(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per source (its counts and facts) and a total: documents in, kept, rejected by
    reason, tokens, seconds."""
    rows = [{"source": name, **_cells(stats)} for name, stats in sorted(report["per_source"].items())]
    per_source = report["per_source"].values()
    reads_documents = not per_source or any("documents_in" in stats for stats in per_source)
    # a stage that reads no documents (mix reads the manifest) shows no "0 in, 0 kept"
    total = {"documents_in": report["documents_in"], "kept": report["kept"], "rejected": report["rejected"]}
    total = total if reads_documents else {}
    rows.append(
        {
            "source": "(all)",
            **_cells(total),
            "tokens": report["tokens"],
            "seconds": round(report["seconds"], 2),
        }
    )
    return rows


def stage_name(run: StageFunction) -> str:
    """``run_ingest`` -> ``ingest``."""
    return run.__name__.removeprefix("run_")


def stage_lines(report: dict[str, Any]) -> list[str]:
    """What a stage read, kept and quarantined, per source and in total, and its note: the lines
    a person watching the run's log reads."""
    lines = []
    for source, stats in sorted(report["per_source"].items()):
        if "documents_in" in stats:
            lines.append(
                f"{source}: read {stats['documents_in']} documents, kept {stats['kept']}, "
                f"quarantined {sum(stats['rejected'].values())} ({top_reasons(stats['rejected'], shown=None)})"
            )
    if lines:
        lines.append(
            f"all sources: read {report['documents_in']}, kept {report['kept']}, "
            f"quarantined {report['rejected_total']} ({top_reasons(report['rejected'], shown=None)})"
        )
    if report["tokens"]:
        lines.append(f"{report['tokens']} tokens")
    if report["note"]:
        lines.append(report["note"])
    return lines


def run_stage_task(
    run: StageFunction,
    repo_spec: str,
    branch: str,
    input_commit: str,
    config: Any,
    flow_run_id: str | None,
    **options: Any,
) -> StageResult:
    """What a ``<stage>_task`` does: run the stage and commit it (:func:`tasks.stage.run_stage`),
    log what it did, leave its table artifact."""
    log = stage_logger(run.__module__)
    log.info("%s: input commit %s onto branch %s", stage_name(run), input_commit, branch)
    result = run_stage(run, open_repo(repo_spec), branch, input_commit, config, flow_run_id, **options)
    report = result.report
    for line in stage_lines(report):
        log.info("%s: %s", result.stage, line)
    gate = (report["expectations"] or {}).get("summary", "none")
    log.info("%s: gate %s; %.1f s; commit %s", result.stage, gate, report["seconds"], result.commit_id)
    if TaskRunContext.get() is not None:  # ``task.fn`` leaves no artifact
        leave_stage_table(result)
    return result


def leave_stage_table(result: StageResult, computed_by: str | None = None) -> None:
    """The stage's ``<stage>-stage`` table artifact. A reused stage (its task Cached, its body
    not run; ``computed_by`` the run that computed it, empty if unknown) gets that run's table,
    so every run shows every stage."""
    note = f"{result.stage} stage"
    if computed_by is not None:
        note += f", reused, computed by {f'run {computed_by}' if computed_by else 'an earlier run'}"
    create_table_artifact(
        table=stage_table(result.report),
        key=f"{result.stage}-stage",
        description=f"{note}, commit {result.commit_id}",
    )
