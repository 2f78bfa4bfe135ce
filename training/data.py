"""The training data of one dataset commit: opening it, and the in-process (thread) loader.

* :func:`open_streaming` binds to a commit without copying its shards: the dataset's rows
  come through a :class:`~training.streaming.ShardStream` over the node's bounded
  :class:`~training.shard_cache.ShardCache`, so training starts as soon as the shards of
  its first batches are local. :func:`open_dataset` copies every shard first (the fully
  downloaded dataset: tests, benchmarks, a warm cache).
* The sample order (:func:`~training.samples.batch_positions`) is a pure function of (mix
  plan, cursor, skipped windows); see :mod:`training.samples`.
* :class:`Loader` (``data.loader = "thread"``) assembles this rank's batches on a
  background thread into a bounded buffer and measures how long each step waits for one.
  The default loader is a process per node with a shadow (:mod:`training.loader_pool`);
  both hand out the same batches, so either gives the same losses.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from formats.shards import read_shard
from training.samples import (
    CommitFiles,
    DataBinding,
    DataError,
    TokenDataset,
    batch_positions,
    bind,
    rank_slice,
    read_binding,
    read_commit_files,
    train_sequence_counts,
)
from training.shard_cache import ShardCache
from training.streaming import BatchPlanner, ShardStream
from versioning import DataRepo

__all__ = [
    "Batch",
    "DataBinding",
    "DataError",
    "Loader",
    "ShardCache",
    "StreamedCommit",
    "TokenDataset",
    "batch_positions",
    "describe_samples",
    "open_dataset",
    "open_streaming",
    "read_binding",
    "train_sequence_counts",
]


@dataclass
class Batch:
    """One optimizer step's data on this rank."""

    start: int  # cursor before the batch: the window [start, end) is what a rollback skips
    end: int
    positions: np.ndarray  # the global batch, every rank's samples, in chunk order
    tokens: torch.Tensor  # [accumulation, micro_batch, seq_len + 1] of this rank
    source: np.ndarray  # this rank's samples, flattened in micro-step order
    index: np.ndarray


Notify = Callable[[dict[str, Any]], None]
"""Receives a loader's reports (data-wait warnings; takeovers of loader processes) as metrics
records: ``kind``, the figures, and a ``message`` in words."""


class Loader:
    """This rank's batches, assembled ahead on a background thread (a stateful iterator).

    ``state_dict`` is the position after the last batch handed out (not the producer's),
    plus the skipped windows, so a checkpoint resumes exactly at the next unseen batch.
    With a ``stream``, the shards of the next ``lookahead`` batches are fetched ahead.
    """

    def __init__(
        self,
        dataset: TokenDataset,
        global_batch: int,
        micro_batch: int,
        rank: int,
        world_size: int,
        prefetch: int,
        pin_memory: bool = False,
        stream: ShardStream | None = None,
        lookahead: int = 8,
        notify: Notify | None = None,
        wait_warning_s: float = 5.0,
    ):
        self.dataset = dataset
        self.global_batch = global_batch
        self.micro_batch = micro_batch
        self.rank = rank
        self.world_size = world_size
        self.accumulation = global_batch // (micro_batch * world_size)
        self.prefetch = prefetch
        self.pin_memory = pin_memory
        self.stream = stream
        self.notify = notify
        self.wait_warning_s = wait_warning_s
        self.cursor = 0
        self.skipped: list[tuple[int, int]] = []
        self.wait_seconds = 0.0  # time the last next_batch() waited for data
        self.longest_wait_s = 0.0
        self._planner = BatchPlanner(
            dataset, global_batch, micro_batch, world_size, [rank], max(prefetch, lookahead), stream
        )
        self._queue: queue.Queue = queue.Queue(maxsize=prefetch)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def state_dict(self) -> dict:
        return {"cursor": self.cursor, "skipped": [list(w) for w in self.skipped]}

    def load_state_dict(self, state: dict) -> None:
        self.close()
        self.cursor = int(state["cursor"])
        self.skipped = sorted((int(a), int(b)) for a, b in state["skipped"])

    def skip(self, start: int, end: int) -> None:
        """Never train on positions ``[start, end)`` (takes effect for batches not yet produced)."""
        self.close()
        self.skipped = sorted({*self.skipped, (start, end)})

    def my_slice(self, positions: np.ndarray) -> np.ndarray:
        """This rank's samples of a global batch: chunks a*world + rank, a = 0..accumulation-1."""
        return rank_slice(positions, self.rank, self.world_size, self.micro_batch)

    def _produce(self) -> None:
        try:
            while not self._stop.is_set():
                assembled = self._planner.next()
                tokens = torch.from_numpy(assembled.rows[0]).view(self.accumulation, self.micro_batch, -1)
                if self.pin_memory:
                    tokens = tokens.pin_memory()
                item = Batch(
                    assembled.start,
                    assembled.end,
                    assembled.positions,
                    tokens,
                    assembled.source[0],
                    assembled.index[0],
                )
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # handed to the consumer, which raises it
            self._queue.put(exc)

    def next_batch(self) -> Batch:
        if self._thread is None:
            self._queue = queue.Queue(maxsize=self.prefetch)
            self._stop.clear()
            self._planner.reset(self.cursor, self.skipped)
            self._thread = threading.Thread(target=self._produce, name="loader", daemon=True)
            self._thread.start()
        started = time.perf_counter()
        warned = ""
        while True:
            try:
                item = self._queue.get(timeout=0.25)
                break
            except queue.Empty:
                waited = time.perf_counter() - started
                reason = (self.stream.reason if self.stream else "") or "the loader thread is assembling it"
                if self.notify and waited >= self.wait_warning_s and reason != warned:
                    warned = reason
                    self.notify({"kind": "data_wait", "waited_s": waited, "reason": reason,
                                 "message": f"waiting {waited:.1f} s for data: {reason}"})  # fmt: skip
        self.wait_seconds = time.perf_counter() - started
        self.longest_wait_s = max(self.longest_wait_s, self.wait_seconds)
        if isinstance(item, BaseException):
            self.close()
            raise item
        self.cursor = item.end
        return item

    def report(self) -> dict:
        """What the loader did, for the run's metrics."""
        return {"loader": "thread", "longest_data_wait_ms": 1000 * self.longest_wait_s}

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            while self._thread.is_alive():
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    self._thread.join(timeout=0.05)
            self._thread = None


@dataclass(frozen=True)
class StreamedCommit:
    """A commit bound for training: what it is, its sample space, and the stream of its shards."""

    binding: DataBinding
    files: CommitFiles  # the manifest and mix as read (loader processes get them from here)
    dataset: TokenDataset
    stream: ShardStream


def open_streaming(
    repo: DataRepo,
    repo_spec: str,
    commit: str,
    cache: ShardCache,
    heldout_fraction: float,
    open_repo: Callable[[], DataRepo],
    *,
    workers: int = 4,
    fetch_timeout_s: float = 1800.0,
    warn: Callable[[str], None] = print,
) -> StreamedCommit:
    """Bind to ``commit`` and stream its shards on demand (nothing is copied before training)."""
    files = read_commit_files(repo, commit)
    binding, manifest, plan = bind(files, repo_spec, commit)
    stream_box: list[ShardStream] = []
    dataset = TokenDataset(manifest, plan, heldout_fraction, lambda shard: stream_box[0].array(shard))
    stream = ShardStream(
        cache, open_repo, commit, dataset, workers=workers, fetch_timeout_s=fetch_timeout_s, warn=warn
    )
    stream_box.append(stream)
    return StreamedCommit(binding, files, dataset, stream)


def open_dataset(
    repo: DataRepo,
    repo_spec: str,
    commit: str,
    cache: ShardCache,
    heldout_fraction: float,
    fetch: bool,
    barrier: Callable[[], None],
) -> tuple[DataBinding, TokenDataset]:
    """Bind to ``commit`` with every shard copied into the cache and verified first.

    ``fetch`` is true on one process per machine, which fills the cache; the others wait at
    ``barrier`` and then open the same verified files.
    """
    binding, manifest, plan = read_binding(repo, repo_spec, commit)
    entries = [e for name in plan.source_names for e in manifest.shards_of(name)]
    error: DataError | None = None
    if fetch:
        try:
            for entry in entries:
                cache.fetch(repo, commit, entry)
        except DataError as exc:
            error = exc
    barrier()
    if error is not None:
        raise error
    paths = [cache.path_for(e.sha256) for e in entries]
    missing = [e.name for e, p in zip(entries, paths, strict=True) if not p.exists()]
    if missing:
        raise DataError(f"shards missing from the cache after fetching: {', '.join(missing[:5])}")
    opened: dict[int, np.ndarray] = {}

    def shard_array(shard: int) -> np.ndarray:
        if shard not in opened:
            opened[shard] = dataset.check_shard(shard, read_shard(paths[shard])[1])
        return opened[shard]

    dataset = TokenDataset(manifest, plan, heldout_fraction, shard_array)
    return binding, dataset


def describe_samples(dataset: TokenDataset, batch: Batch) -> dict:
    """This rank's samples of a batch as JSON-ready ids (the sample log of the elastic test)."""
    names = dataset.plan.source_names
    return {
        "positions": [int(p) for p in batch.positions],
        "samples": [
            f"{names[s]}/{k}" for s, k in zip(batch.source.tolist(), batch.index.tolist(), strict=True)
        ],
    }
