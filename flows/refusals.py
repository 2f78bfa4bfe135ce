"""Refusals: runs that end because tokenlake decided so, not because of a bug.

A gate that did not hold, a resume that the changed data forbids, data that a rollback reverted,
a tag that does not exist: each says in its message what happened and what to change. Prefect
logs the exception that ends a task or flow run with its traceback: 70-odd lines that bury that
message and read as a crash. :class:`RefusalWithoutTraceback` keeps Prefect's one line and drops
the traceback when the exception is a :class:`Refusal`, so a traceback in a run's log always
means a bug (an unexpected exception), which keeps its traceback.

The filter sits on Prefect's two engine loggers, as Prefect's own ``ObfuscateApiKeyFilter``
does (``prefect.logging.loggers.get_logger``). It is installed when this module is imported,
and every flow module imports it (through the refusals they raise), so it is in place wherever
a flow runs: the ``tokenlake`` commands, ``tokenlake serve``'s flow-run processes, a worker on
another machine. (Prefect's documented alternative, a whole ``logging.yml`` of one's own with a
``filters`` entry, would have to be set on every machine and replaces Prefect's logging config.)

A refusal is deterministic, so it is never retried: the stage and publish tasks retry transient
storage errors only (``tasks.stage_task.retry_transient``), and the torchrun task retries
anything but a refusal (:func:`retry_unless_refused`).

The exception types of the layers below ``flows/`` (which cannot import this module) are
registered here; the flows' own refusals are registered where they are defined, with
``@Refusal.register``.
"""

from __future__ import annotations

import logging
from abc import ABC
from typing import Any

from tasks.gates import ExpectationsFailed
from tasks.stage import ConfigError
from training.errors import TrainingError

# the loggers of Prefect's task and flow run engines (prefect.logging.loggers)
ENGINE_LOGGERS = ("prefect.task_runs", "prefect.flow_runs")


class Refusal(ABC):  # noqa: B024 (a marker: isinstance() answers whether an exception is one)
    """An exception that ends a run on purpose; its message is the whole explanation."""


Refusal.register(ExpectationsFailed)  # a stage's Great Expectations gate did not hold
Refusal.register(ConfigError)  # a misconfiguration found before any work
Refusal.register(TrainingError)  # a run that cannot start or go on as configured


@Refusal.register
class PublishRefused(RuntimeError):
    """A publish gate of a curate run (``[gates]``) did not hold; the message lists every one.

    (A stage's own Great Expectations suites failing is :class:`tasks.gates.ExpectationsFailed`.)
    """

    def __init__(self, failures: list[str]):
        super().__init__("not published: " + "; ".join(failures))
        self.failures = failures

    def __reduce__(self) -> tuple[Any, ...]:  # pickled with Prefect's results: rebuilt from the parts
        return (type(self), (self.failures,))


def is_refusal(exc: BaseException | None) -> bool:
    return isinstance(exc, Refusal)


def retry_unless_refused(task: Any, task_run: Any, state: Any) -> bool:
    """A task's ``retry_condition_fn``: retry a failure unless it is a refusal, which would refuse again."""
    try:
        state.result()
    except Exception as exc:
        return not is_refusal(exc)
    return True


class RefusalWithoutTraceback(logging.Filter):
    """Drops the traceback from a record about a refusal; every record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and is_refusal(record.exc_info[1]):
            record.exc_info = None
            record.exc_text = None
        return True


_FILTER = RefusalWithoutTraceback()


def install() -> None:
    """Put the filter on Prefect's engine loggers (again is a no-op: a logger holds a filter once)."""
    for name in ENGINE_LOGGERS:
        logging.getLogger(name).addFilter(_FILTER)


install()
