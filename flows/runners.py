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

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from prefect.task_runners import ProcessPoolTaskRunner, TaskRunner, ThreadPoolTaskRunner

from tasks.partition_map import InProcess, use
from tasks.partition_task import OnTaskRunner


def task_runner(spec: str, workers: int = 1, memory_limit: str = "auto") -> TaskRunner:
    """The Prefect task runner named by ``spec`` (``local``, ``dask`` or ``dask:<scheduler address>``)."""
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
            "dashboard_address": None,
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
def partitions_on(spec: str, workers: int = 1, memory_limit: str = "auto") -> Iterator[TaskRunner | None]:
    """Stages called inside the block submit their partitions to the runner named by ``spec``
    (in this process, as outside a flow, for one local worker)."""
    if spec == "local" and workers == 1:
        with use(InProcess()):
            yield None
        return
    runner = task_runner(spec, workers, memory_limit)
    with dask_worker_config(spec), runner, use(OnTaskRunner(runner)):
        yield runner


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
