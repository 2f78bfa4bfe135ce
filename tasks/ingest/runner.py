"""Running partitions: in this process or in a pool of processes, results in plan order
(so the output is the same whatever the parallelism), each partition retried alone."""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from typing import TypeVar

import pyarrow as pa

from tasks.ingest.config import IngestConfig, SourceConfig
from tasks.ingest.documents import ingest_partition
from tasks.ingest.partitions import Partition
from tasks.stage import ConfigError

log = logging.getLogger(__name__)
T = TypeVar("T")
RETRY_BASE_SECONDS = 0.5


class PartitionFailed(RuntimeError):
    """A partition kept failing after its retries."""


def with_retries(
    work: Callable[[], T], retries: int, what: str, backoff_seconds: float = RETRY_BASE_SECONDS
) -> T:
    """``work()``, retried up to ``retries`` times with exponential backoff; a config error is not retried."""
    for attempt in range(retries + 1):
        try:
            return work()
        except ConfigError:
            raise
        except Exception as exc:
            if attempt == retries:
                raise PartitionFailed(f"{what} failed {retries + 1} time(s); last error: {exc!r}") from exc
            log.warning("%s failed (%r); retry %d of %d", what, exc, attempt + 1, retries)
            time.sleep(backoff_seconds * 2**attempt)
    raise AssertionError("unreachable")


def describe(partition: Partition) -> str:
    where = (
        partition.rel if len(partition.files) == 1 else f"{partition.rel} (+{len(partition.files) - 1} files)"
    )
    span = f" [{partition.start}:{partition.end}]" if partition.start or partition.end >= 0 else ""
    return f"partition {partition.index} of source {partition.source!r} ({where}{span})"


def run_partitions(
    source: SourceConfig, partitions: list[Partition], config: IngestConfig
) -> Iterator[tuple[Partition, pa.Table, pa.Table]]:
    """``(partition, kept, quarantined)`` for every partition, in order."""
    if config.workers == 1 or len(partitions) == 1:
        for p in partitions:
            kept, quarantined = with_retries(
                lambda p=p: ingest_partition(source, p, config), config.partition_retries, describe(p)
            )
            yield p, kept, quarantined
        return
    # spawn, not fork: the parent may run Prefect's threads, and forking a threaded process is unsafe
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(config.workers, mp_context=context) as pool:
        pending: deque[tuple[Partition, Future]] = deque()
        queue = iter(partitions)
        window = 2 * config.workers  # bounds memory: results wait in order for at most this many partitions
        for p in queue:
            pending.append((p, pool.submit(ingest_partition, source, p, config)))
            if len(pending) >= window:
                yield _collect(pool, *pending.popleft(), source, config)
        while pending:
            yield _collect(pool, *pending.popleft(), source, config)


def _collect(
    pool: ProcessPoolExecutor,
    partition: Partition,
    future: Future,
    source: SourceConfig,
    config: IngestConfig,
) -> tuple[Partition, pa.Table, pa.Table]:
    first = [future]

    def attempt() -> tuple[pa.Table, pa.Table]:
        pending = first.pop() if first else pool.submit(ingest_partition, source, partition, config)
        return pending.result()

    kept, quarantined = with_retries(attempt, config.partition_retries, describe(partition))
    return partition, kept, quarantined
