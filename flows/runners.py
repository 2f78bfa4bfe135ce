"""Where a curate run's partitions run: Prefect task runners chosen by ``CurateParams.runner``.

* ``local``: this machine. One worker (the default): the partitions run one after the other in
  the flow's process (:class:`tasks.partition_map.InProcess`, each retried alone), so the run's
  graph shows its stages and nothing else; more: Prefect's ``ProcessPoolTaskRunner`` with that
  many processes.
* ``dask``: ``prefect_dask.DaskTaskRunner`` on a ``distributed.LocalCluster`` of ``workers``
  worker processes (one thread each, ``memory_limit`` each) started for the run.
* ``dask:tcp://host:8786``: ``DaskTaskRunner`` on an existing scheduler; its workers must see the
  dataset repository the flow sees (lakeFS, or the same path for a local repository) and have
  tokenlake installed.

Past one local worker each partition is a Prefect task run (:mod:`tasks.partition_task`); the published bytes do
not depend on which runner ran them (``tests/flows/test_curate_runners.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from prefect.task_runners import ProcessPoolTaskRunner, TaskRunner, ThreadPoolTaskRunner

from flows.notices import notice
from tasks.partition_map import InProcess, use
from tasks.partition_task import OnTaskRunner


def task_runner(
    spec: str, workers: int = 1, memory_limit: str = "auto", dashboard: str | None = None
) -> TaskRunner:
    """The Prefect task runner named by ``spec`` (``local``, ``dask`` or ``dask:<scheduler address>``);
    ``dashboard``: the address of a LocalCluster's dashboard, none by default."""
    kind, _, address = spec.partition(":")
    if kind == "local" and not address:
        return (
            ThreadPoolTaskRunner(max_workers=1)
            if workers == 1
            else ProcessPoolTaskRunner(max_workers=workers)
        )
    if kind == "dask":
        from prefect_dask import DaskTaskRunner

        if address:
            return DaskTaskRunner(address=address)
        cluster: dict[str, Any] = {
            "n_workers": workers,
            "threads_per_worker": 1,  # stages are CPU-bound Python, NumPy and Arrow: one partition per core
            "processes": True,
            "memory_limit": memory_limit,
            "dashboard_address": dashboard,
            # distributed starts the scheduler's HTTP server (health, metrics) without a dashboard
            # too, on :8787 of the scheduler's host: loopback on a free port keeps it out of the way
            "scheduler_kwargs": {} if dashboard else {"dashboard_address": "127.0.0.1:0"},
            # Arrow's default pool (mimalloc) keeps the pages a finished partition freed, so a
            # worker's RSS only grows and Dask pauses it at 80% of memory_limit with nothing to
            # spill: the system allocator, with the MALLOC_TRIM_THRESHOLD_ Dask sets, returns them.
            "env": {"ARROW_DEFAULT_MEMORY_POOL": "system"},
        }
        return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs=cluster)
    raise ValueError(
        f"runner {spec!r} is not one of: local, dask, dask:<scheduler address such as tcp://host:8786>"
    )


@contextmanager
def partitions_on(
    spec: str, workers: int = 1, memory_limit: str = "auto", dashboard: str | None = None
) -> Iterator[TaskRunner | None]:
    """Stages called inside the block submit their partitions to the runner named by ``spec``
    (in this process, as outside a flow, for one local worker)."""
    if spec == "local" and workers == 1:
        with use(InProcess()):
            yield None
        return
    runner = task_runner(spec, workers, memory_limit, dashboard)
    with dask_worker_config(spec), _entered(runner, spec, dashboard), use(OnTaskRunner(runner)):
        yield runner


@contextmanager
def _entered(runner: TaskRunner, spec: str, dashboard: str | None) -> Iterator[None]:
    """Enter ``runner``; a dashboard asked for is announced with its URL. prefect-dask announces a
    LocalCluster's scheduler HTTP server as "the Dask dashboard" whether or not one is served:
    without one, that line is dropped."""
    unasked = _UnaskedDashboardLine() if spec == "dask" and dashboard is None else None
    if unasked:
        runner.logger.addFilter(unasked)
    try:
        with runner:
            if dashboard is not None:
                notice(f"Dask dashboard: {runner.client.dashboard_link}", logging.INFO)
            yield
    finally:
        if unasked:
            runner.logger.removeFilter(unasked)


class _UnaskedDashboardLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("The Dask dashboard is available")


def dask_worker_config(spec: str) -> AbstractContextManager[Any]:
    """Dask settings for the workers of a ``LocalCluster`` started for the run (a nanny hands its
    config to the worker it spawns). Pausing is off: a stage's partitions hold their data as
    unmanaged memory, which a paused worker can neither spill nor free, so a worker past 80% of
    ``memory_limit`` would wait forever (seen in ``benchmarks/scale.py``); past 95% the nanny
    still restarts it and the partition task is retried. The statistical profiler is off: it
    samples each worker's stack every 10 ms and keeps an hour of profile trees: with it a worker
    grew ~50 KB per partition task (500 no-op tasks: +25 MB; without it +5 MB), which set the
    dedup memory bar's peak on a 16-minute run. Prefect's UI is where a run's tasks are read."""
    if spec != "dask":
        return nullcontext()
    import dask

    return dask.config.set(
        {"distributed.worker.memory.pause": False, "distributed.worker.profile.enabled": False}
    )
