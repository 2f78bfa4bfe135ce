"""What every stage's Prefect task shares: which failures are worth a retry, and where to log."""

from __future__ import annotations

import logging
from typing import Any

from prefect.artifacts import create_table_artifact
from prefect.context import TaskRunContext
from prefect.logging import get_run_logger

from tasks.stage import StageResult
from versioning import TransientError


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry storage hiccups only, never bad input, a misconfiguration or a failed gate."""
    try:
        state.result()
    except (TransientError, ConnectionError, TimeoutError):
        return True
    except BaseException:
        return False
    return False


# every task that talks to the repository (stages, branch and publish tasks): exponential
# backoff with jitter, so many runs retrying one lakeFS do not retry in step
IO_RETRIES: dict[str, Any] = {
    "retries": 4,
    "retry_delay_seconds": [1, 2, 4, 8],
    "retry_jitter_factor": 0.5,
    "retry_condition_fn": retry_transient,
}


def stage_logger(name: str) -> logging.Logger | logging.LoggerAdapter:
    """The Prefect run logger inside a task run; the module's logger when called as ``task.fn``."""
    return get_run_logger() if TaskRunContext.get() else logging.getLogger(name)


def stage_table(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per source and a total: documents in, kept, rejected by reason, seconds."""
    reasons = sorted(report["rejected"])
    rows = [
        {
            "source": name,
            "documents_in": s["documents_in"],
            "kept": s["kept"],
            **{f"rejected_{r}": s["rejected"].get(r, 0) for r in reasons},
        }
        for name, s in sorted(report["per_source"].items())
    ]
    rows.append(
        {
            "source": "(all)",
            "documents_in": report["documents_in"],
            "kept": report["kept"],
            **{f"rejected_{r}": report["rejected"][r] for r in reasons},
            "seconds": round(report["seconds"], 2),
        }
    )
    return rows


def stage_table_artifact(result: StageResult, note: str = "") -> None:
    """The stage's table in the Prefect UI (only inside a task run; ``task.fn`` leaves none)."""
    if TaskRunContext.get() is not None:
        create_table_artifact(
            table=stage_table(result.report),
            key=f"{result.stage}-stage",
            description=f"{result.stage} stage{note}, commit {result.commit_id}",
        )
