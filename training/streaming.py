"""Streaming a commit's shards in the order training needs them, and assembling batches from them.

* :class:`ShardStream` keeps the shards a reader needs next local: fetch workers take the
  wanted shards nearest in steps first, through the node's :class:`ShardCache` (bounded,
  shared, verified). A transient repository failure is retried with backoff, and the
  reason is kept for the data-wait warning, until ``fetch_timeout_s`` of failing; a shard
  that fails verification twice is an error raised when that shard is read.
* :class:`BatchPlanner` turns the sample order into batches: from a cursor and the skipped
  windows it computes the next ``lookahead`` global batches (a pure function of the plan),
  tells the stream which shards each needs and when, and assembles the next batch's rows
  for a set of ranks.

Both loaders use them: the thread loader (:class:`training.data.Loader`) for one rank, a
loader process (:mod:`training.loader_process`) for every rank of a node. No torch here.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from formats.shards import ShardFormatError, read_shard
from training.samples import DataError, TokenDataset, batch_positions, rank_slice
from training.shard_cache import ShardCache
from versioning import DataRepo, RepoError, TransientError

_MAX_BACKOFF_S = 2.0  # a repository that comes back is noticed within this


class ShardStream:
    """The shards one reader needs, fetched ahead in order of need (``array`` is the provider
    of :class:`TokenDataset`)."""

    def __init__(
        self,
        cache: ShardCache,
        open_repo: Callable[[], DataRepo],
        commit: str,
        dataset: TokenDataset,
        *,
        workers: int = 4,
        fetch_timeout_s: float = 1800.0,
        heartbeat: Callable[[], None] = lambda: None,
        warn: Callable[[str], None] = print,
    ):
        self.cache = cache
        self.commit = commit
        self.dataset = dataset
        self.fetch_timeout_s = fetch_timeout_s
        self.heartbeat = heartbeat
        self._warn = warn
        self._open_repo = open_repo
        self._reader = cache.reader()
        self._cond = threading.Condition()
        self._wanted: dict[int, int] = {}  # shard number -> steps until it is read
        self._local: set[int] = set()  # fetched and verified, not since let go
        self._inflight: set[int] = set()
        self._deferred: set[int] = set()  # no room yet; tried again when the needs move on
        self._needs_version = 0  # bumped by want(): a fetch refused under older needs is not deferred
        self._errors: dict[int, DataError] = {}
        self._arrays: dict[int, np.ndarray] = {}
        self._closed = False
        self.reason = ""  # why the stream is behind, when it is (for the data-wait warning)
        self._threads = [
            threading.Thread(target=self._fetch_loop, name=f"shard-fetch-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def want(self, needs: dict[int, int]) -> None:
        """From now on the shards needed are ``needs`` (shard number -> steps until it is read)."""
        with self._cond:
            self._wanted = dict(needs)
            self._local &= needs.keys()
            self._deferred.clear()
            self._needs_version += 1
            for shard in [s for s in self._arrays if s not in needs]:
                del self._arrays[shard]  # unmapped: an evicted file's space is freed
            self._publish()
            self._cond.notify_all()

    def array(self, shard: int) -> np.ndarray:
        """The rows of ``shard``, waiting for its fetch. A shard nobody said it wants is fetched
        now, read, and not kept wanted (nor mapped) afterwards: an on-demand read."""
        rows = self._arrays.get(shard)
        if rows is not None:
            return rows
        on_demand = False
        while True:
            with self._cond:
                if shard not in self._wanted:
                    on_demand = True
                    self._wanted[shard] = 0
                    self._publish()
                    self._cond.notify_all()
                while shard not in self._local:
                    if shard in self._errors:
                        raise self._errors[shard]
                    if self._closed:
                        raise DataError("the shard stream was closed while a batch waited for a shard")
                    self._cond.wait(0.1)
                    self.heartbeat()
            path = self.cache.path_for(self.dataset.entries[shard].sha256)
            try:
                rows = self.dataset.check_shard(shard, read_shard(path)[1])
            except FileNotFoundError:  # evicted between its fetch and now: fetch it again
                with self._cond:
                    self._local.discard(shard)
                continue
            except ShardFormatError as exc:
                raise DataError(f"shard {self.dataset.entries[shard].name}: {exc}") from None
            with self._cond:
                if on_demand:
                    self._wanted.pop(shard, None)
                    self._local.discard(shard)
                    self._publish()
                else:
                    self._arrays[shard] = rows
            return rows

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._reader.close()

    def _publish(self) -> None:
        entries = self.dataset.entries
        self._reader.set_needs({entries[s].sha256: d for s, d in self._wanted.items()})

    def _next_shard(self) -> tuple[int, int] | None:
        waiting = [
            (d, s)
            for s, d in self._wanted.items()
            if s not in self._local
            and s not in self._inflight
            and s not in self._deferred
            and s not in self._errors
        ]
        return min(waiting) if waiting else None

    def _fetch_loop(self) -> None:
        repo = self._open_repo()
        while True:
            with self._cond:
                picked = self._next_shard()
                while picked is None and not self._closed:
                    self._cond.wait(0.5)
                    picked = self._next_shard()
                if self._closed:
                    return
                distance, shard = picked
                self._inflight.add(shard)
                version = self._needs_version
            outcome = self._fetch(repo, shard, distance)
            with self._cond:
                self._inflight.discard(shard)
                if outcome is True:
                    self._local.add(shard)
                elif outcome is False:
                    # refused for room at the distance it was wanted at; when the needs have moved
                    # on meanwhile (it may be needed next), it is picked again at its new distance
                    if version == self._needs_version:
                        self._deferred.add(shard)
                else:
                    self._errors[shard] = outcome
                self._cond.notify_all()

    def _fetch(self, repo: DataRepo, shard: int, distance: int) -> bool | DataError:
        """True: local; False: no room yet; a DataError: it cannot be had."""
        entry = self.dataset.entries[shard]
        failing_since, failures = None, 0
        while not self._closed:
            try:
                path = self.cache.fetch(repo, self.commit, entry, distance)
            except DataError as exc:
                return exc
            except (TransientError, ConnectionError, TimeoutError) as exc:
                failures += 1
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > self.fetch_timeout_s:
                    return DataError(
                        f"shard {entry.name} could not be fetched for {now - failing_since:.0f} s "
                        f"(data.fetch_timeout_s): {exc}; check the dataset repository, then resume the run"
                    )
                self.reason = f"fetching {entry.name}: the repository is unreachable ({exc}); retrying"
                if failures == 1:
                    self._warn(self.reason)
                time.sleep(min(_MAX_BACKOFF_S, 0.05 * 2**failures))
                continue
            except RepoError as exc:
                return DataError(f"shard {entry.name} cannot be read at commit {self.commit}: {exc}")
            except OSError as exc:
                return DataError(
                    f"shard {entry.name} cannot be written to the shard cache {self.cache.root}: {exc}"
                )
            if failing_since is not None:
                self._warn(f"fetched {entry.name} after {time.monotonic() - failing_since:.1f} s of failures")
                self.reason = ""
            return path is not None
        return False


@dataclass
class AssembledBatch:
    """One global batch's samples for some ranks (rows in each rank's micro-step order)."""

    start: int
    end: int
    positions: np.ndarray  # the whole global batch, in chunk order
    source: list[np.ndarray]  # per rank
    index: list[np.ndarray]
    rows: list[np.ndarray]  # per rank: [samples, seq_len + 1] int64


@dataclass
class _Planned:
    start: int
    end: int
    positions: np.ndarray
    source: list[np.ndarray]
    index: list[np.ndarray]
    shards: np.ndarray


class BatchPlanner:
    """Batches for ``ranks`` from a cursor on, with their shards wanted ``lookahead`` steps ahead."""

    def __init__(
        self,
        dataset: TokenDataset,
        global_batch: int,
        micro_batch: int,
        world_size: int,
        ranks: list[int],
        lookahead: int,
        stream: ShardStream | None = None,
    ):
        self.dataset = dataset
        self.global_batch = global_batch
        self.micro_batch = micro_batch
        self.world_size = world_size
        self.ranks = ranks
        self.lookahead = lookahead
        self.stream = stream
        self.cursor = 0  # start of the next batch handed out
        self.skipped: list[tuple[int, int]] = []
        self._ahead: deque[_Planned | DataError] = deque()
        self._scan = 0  # start of the next batch to plan

    def reset(self, cursor: int, skipped: list[tuple[int, int]]) -> None:
        self.cursor = self._scan = cursor
        self.skipped = sorted(skipped)
        self._ahead.clear()

    def _plan(self) -> None:
        while len(self._ahead) <= self.lookahead and not (
            self._ahead and isinstance(self._ahead[-1], DataError)
        ):
            try:
                positions, end = batch_positions(self.dataset, self._scan, self.global_batch, self.skipped)
            except DataError as exc:  # raised only if training gets that far
                self._ahead.append(exc)
                return
            sources, indices = [], []
            for rank in self.ranks:
                mine = rank_slice(positions, rank, self.world_size, self.micro_batch)
                source, _, index = self.dataset.plan.locate(mine)
                sources.append(source)
                indices.append(index)
            shards = self.dataset.shard_numbers(np.concatenate(sources), np.concatenate(indices))
            self._ahead.append(_Planned(self._scan, end, positions, sources, indices, np.unique(shards)))
            self._scan = end

    def advance(self) -> None:
        """Move the cursor past the next batch without reading it (it is already in the ring)."""
        self._plan()
        planned = self._ahead[0]
        if isinstance(planned, DataError):
            raise planned
        self._ahead.popleft()
        self.cursor = planned.end

    def next(self) -> AssembledBatch:
        """The batch at the cursor (waiting for its shards), and the cursor moves past it."""
        self._plan()
        if self.stream is not None:
            needs: dict[int, int] = {}
            for distance, planned in enumerate(self._ahead):
                if isinstance(planned, DataError):
                    break
                for shard in planned.shards.tolist():
                    needs.setdefault(shard, distance)
            self.stream.want(needs)
        planned = self._ahead[0]
        if isinstance(planned, DataError):
            raise planned
        rows = [self.dataset.rows(s, i) for s, i in zip(planned.source, planned.index, strict=True)]
        self._ahead.popleft()
        self.cursor = planned.end
        return AssembledBatch(
            planned.start, planned.end, planned.positions, planned.source, planned.index, rows
        )
