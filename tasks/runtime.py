"""What every stage's Prefect task shares: which failures are worth a retry, and where to log."""

from __future__ import annotations

import logging
from typing import Any

from prefect.context import TaskRunContext
from prefect.logging import get_run_logger

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


# exponential backoff with jitter, so many runs retrying one lakeFS do not retry in step
STAGE_RETRIES: dict[str, Any] = {
    "retries": 4,
    "retry_delay_seconds": [1, 2, 4, 8],
    "retry_jitter_factor": 0.5,
    "retry_condition_fn": retry_transient,
}


def stage_logger(name: str) -> logging.Logger | logging.LoggerAdapter:
    """The Prefect run logger inside a task run; the module's logger when called as ``task.fn``."""
    return get_run_logger() if TaskRunContext.get() else logging.getLogger(name)
