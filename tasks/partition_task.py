"""Partitions as Prefect tasks: :class:`OnTaskRunner` submits each partition of a stage to a
Prefect task runner (``ThreadPoolTaskRunner``/``ProcessPoolTaskRunner`` on this machine,
``prefect_dask.DaskTaskRunner`` on a Dask cluster). Each partition is a task run of its own in the
UI, named ``<name>-<index>``, with its own retries; the runner, not tokenlake, schedules them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import TaskRunner
from prefect.tasks import exponential_backoff

from tasks.partition_map import no_retry

T = TypeVar("T")
R = TypeVar("R")


def retry_unless_config_error(task: Any, task_run: Any, state: Any) -> bool:
    """A partition is retried after any failure but a misconfiguration (which a retry cannot fix)."""
    try:
        state.result()
    except BaseException as exc:  # noqa: BLE001 - the failure is the question here
        return not no_retry(exc)
    return False


@task(
    name="partition",
    cache_policy=NO_CACHE,
    persist_result=False,
    retry_condition_fn=retry_unless_config_error,
)
def partition_task(work: Callable[[Any], Any], item: Any) -> Any:
    """One partition of a stage: ``work(item)``, which writes to the repository and returns a small report."""
    return work(item)


class OnTaskRunner:
    """Each partition a Prefect task on ``runner`` (already started, e.g. by ``with runner:``)."""

    def __init__(self, runner: TaskRunner):
        self.runner = runner

    def map(
        self,
        name: str,
        work: Callable[[T], R],
        items: Sequence[T],
        retries: int = 0,
        describe: Callable[[T], str] | None = None,
    ) -> Iterator[R]:
        futures: list[Any] = []
        for index, item in enumerate(items):
            runnable = partition_task.with_options(
                name=name,
                task_run_name=f"{name}-{index}",
                retries=retries,
                retry_delay_seconds=exponential_backoff(backoff_factor=1)(max(retries, 1)),  # 1, 2, 4, ... s
            )
            futures.append(self.runner.submit(runnable, {"work": work, "item": item}))
        for index in range(len(futures)):
            # drop each future once its result is taken: while the flow holds a future, the
            # worker that ran it keeps the task (its arguments included) in memory
            future, futures[index] = futures[index], None
            yield future.result()
