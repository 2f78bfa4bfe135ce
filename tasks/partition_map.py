"""How a stage maps its work over partitions (DESIGN.md section 10): one code path, two runners.

A stage's ``run_<stage>`` cuts its input into partitions (file groups, JSONL byte ranges and
Parquet row groups for ingest, input parts for validate and dedup, sources for shard) and
calls ``partitions().map(name, work, items)``. ``work`` is a module-level function of one
picklable item: it reads its input from the dataset repository, writes its outputs there, and
returns a small report. Results come back in item order, whatever ran first, so what the stage
writes from them does not depend on the runner or the number of workers.

* :class:`InProcess` (the default, no Prefect): a loop in this process, each item retried alone;
  what :func:`tasks.stage.run_stage` uses outside a flow.
* :class:`tasks.partition_task.OnTaskRunner`: each item a Prefect task submitted to a Prefect
  task runner (threads on this machine, or a Dask cluster through ``prefect-dask``), with the
  task's retries and its run in the UI. The curate flow installs it with :func:`use`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")
log = logging.getLogger(__name__)
RETRY_BASE_SECONDS = 0.5


class PartitionFailed(RuntimeError):
    """A partition kept failing after its retries."""


class PartitionMap(Protocol):
    def map(
        self,
        name: str,
        work: Callable[[T], R],
        items: Sequence[T],
        retries: int = 0,
        describe: Callable[[T], str] | None = None,
    ) -> Iterator[R]:
        """``work(item)`` for each item, in item order, each retried alone up to ``retries`` times."""
        ...


def no_retry(exc: BaseException) -> bool:
    """Errors that a retry cannot fix: a misconfiguration or a failed gate (their message says what to do)."""
    from tasks.stage import ConfigError

    return isinstance(exc, ConfigError)


def with_retries(
    work: Callable[[], R], retries: int, what: str, backoff_seconds: float = RETRY_BASE_SECONDS
) -> R:
    """``work()``, retried up to ``retries`` times with exponential backoff; a config error is not
    retried, and without retries an error is raised as it is."""
    if retries == 0:
        return work()
    for attempt in range(retries + 1):
        try:
            return work()
        except Exception as exc:
            if no_retry(exc):
                raise
            if attempt == retries:
                raise PartitionFailed(f"{what} failed {retries + 1} time(s); last error: {exc!r}") from exc
            log.warning("%s failed (%r); retry %d of %d", what, exc, attempt + 1, retries)
            time.sleep(backoff_seconds * 2**attempt)
    raise AssertionError("unreachable")


class InProcess:
    """Every partition in this process, one after the other."""

    def map(
        self,
        name: str,
        work: Callable[[T], R],
        items: Sequence[T],
        retries: int = 0,
        describe: Callable[[T], str] | None = None,
    ) -> Iterator[R]:
        for i, item in enumerate(items):
            yield with_retries(
                lambda item=item: work(item), retries, describe(item) if describe else f"{name} {i}"
            )


_current: ContextVar[Any] = ContextVar("tokenlake_partition_map", default=None)


def partitions() -> PartitionMap:
    """The partition map in force: the flow's task runner inside a curate run, else this process."""
    return _current.get() or InProcess()


@contextmanager
def use(partition_map: PartitionMap) -> Iterator[PartitionMap]:
    """Run the stages called inside the block with ``partition_map``."""
    token = _current.set(partition_map)
    try:
        yield partition_map
    finally:
        _current.reset(token)
