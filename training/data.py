"""The training data of one dataset commit: shard cache, sample order, prefetching loader.

* :class:`ShardCache` copies the commit's shards into a local cache keyed by sha256 and
  verifies every file against ``shards/manifest.json`` before use: a mismatch is fetched
  again once, then fails naming the shard.
* :func:`batch_positions` is the sample order: a pure function of (mix plan, cursor,
  skipped windows). Global position ``p`` maps through ``MixPlan.locate`` (the shared blend
  and its per-source, per-epoch seeded permutations) to (source, sequence). Positions that
  land on a held-out sequence (the tail of each source, kept for evaluation) or in a
  skipped window are passed over. Nothing depends on the world size: rank ``r`` of ``w``
  trains on chunks ``a*w + r`` of ``micro_batch`` samples of each global batch, so any world
  size with the same global batch trains on the same samples in the same order.
* :class:`Loader` assembles this rank's batches on a background thread into a bounded
  buffer and measures how long each step waits for one.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from formats import layout
from formats.mix import MixPlan
from formats.shards import Manifest, ShardEntry, read_shard
from training.errors import TrainingError
from versioning import DataRepo, NotFound


class DataError(TrainingError):
    """The dataset commit cannot be trained on as it is; the message says what to fix."""


@dataclass(frozen=True)
class DataBinding:
    """What a checkpoint was trained on: stored in every checkpoint and lineage record."""

    repository: str
    commit: str
    manifest_sha256: str
    mix_sha256: str
    tokenizer_sha256: str  # "" when the commit has no tokenizer/tokenizer.json

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    def differences(self, other: dict[str, str]) -> list[str]:
        """Fields (other than the repository's spelling) in which ``other`` differs from this binding."""
        return [
            f"{key} {other.get(key)!r} -> {value!r}"
            for key, value in self.to_dict().items()
            if key != "repository" and other.get(key) != value
        ]


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class ShardCache:
    """Local copies of shards, named by their sha256, checked against the manifest before use."""

    def __init__(self, root: Path, warn: Callable[[str], None] = print):
        self.root = root
        self._warn = warn

    def path_for(self, sha256: str) -> Path:
        return self.root / sha256[:2] / f"{sha256}.bin"

    def fetch(self, repo: DataRepo, commit: str, entry: ShardEntry) -> Path:
        """The verified local path of ``entry``; fetched when absent or corrupt."""
        path = self.path_for(entry.sha256)
        if path.exists():
            if _sha256_file(path) == entry.sha256:
                return path
            self._warn(f"cached {entry.name} ({path.name}) is corrupt; fetching it again")
            path.unlink()
        for attempt in (1, 2):
            actual = self._download(repo, commit, entry.name, path)
            if actual == entry.sha256:
                return path
            path.unlink(missing_ok=True)
            if attempt == 1:
                self._warn(f"{entry.name} at {commit[:12]} arrived with sha256 {actual[:12]}; fetching again")
        raise DataError(
            f"shard {entry.name} at commit {commit} has sha256 {actual} but shards/manifest.json says "
            f"{entry.sha256} (fetched twice): the commit is inconsistent; re-run the shard stage or pick "
            "another commit"
        )

    def _download(self, repo: DataRepo, commit: str, name: str, path: Path) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        digest = hashlib.sha256()
        with repo.open(commit, name) as src, tmp.open("wb") as dst:
            while chunk := src.read(8 << 20):
                digest.update(chunk)
                dst.write(chunk)
            dst.flush()
            os.fsync(dst.fileno())
        os.replace(tmp, path)  # concurrent fetchers of one shard write the same bytes
        return digest.hexdigest()


def _read_object(repo: DataRepo, commit: str, path: str, what: str) -> bytes:
    try:
        return repo.get(commit, path)
    except NotFound:
        raise DataError(f"commit {commit} has no {path}: it holds no published {what}") from None


def read_binding(repo: DataRepo, repo_spec: str, commit: str) -> tuple[DataBinding, Manifest, MixPlan]:
    """Manifest, mix plan and the binding of ``commit`` (small files; read on every rank)."""
    manifest_bytes = _read_object(repo, commit, layout.MANIFEST, "shard manifest")
    mix_bytes = _read_object(repo, commit, layout.MIX, "mix plan (mix.json)")
    try:
        tokenizer_sha = hashlib.sha256(repo.get(commit, layout.TOKENIZER)).hexdigest()
    except NotFound:
        tokenizer_sha = ""
    manifest = Manifest.from_json(manifest_bytes)
    plan = MixPlan.from_json(mix_bytes)
    if plan.seq_len != manifest.seq_len:
        raise DataError(
            f"mix.json is for seq_len {plan.seq_len} but the shards hold seq_len {manifest.seq_len}"
        )
    missing = [s for s in plan.source_names if s not in manifest.sources]
    if missing:
        raise DataError(f"mix.json names sources the manifest lacks: {', '.join(missing)}")
    binding = DataBinding(
        repository=repo_spec,
        commit=commit,
        manifest_sha256=hashlib.sha256(manifest_bytes).hexdigest(),
        mix_sha256=hashlib.sha256(mix_bytes).hexdigest(),
        tokenizer_sha256=tokenizer_sha,
    )
    return binding, manifest, plan


class TokenDataset:
    """Every sequence of the commit's sources, memory-mapped from the cache, plus the held-out split."""

    def __init__(
        self, manifest: Manifest, plan: MixPlan, shard_paths: dict[str, Path], heldout_fraction: float
    ):
        self.manifest = manifest
        self.plan = plan
        self.seq_len = manifest.seq_len
        self._shards: list[list[np.ndarray]] = []
        self._starts: list[np.ndarray] = []
        for name in plan.source_names:
            arrays = [read_shard(shard_paths[e.name])[1] for e in manifest.shards_of(name)]
            self._shards.append(arrays)
            self._starts.append(np.cumsum([0] + [len(a) for a in arrays]))
        sequences = np.asarray(plan.source_sequences, np.int64)
        for name, n, starts in zip(plan.source_names, sequences, self._starts, strict=True):
            if starts[-1] != n:
                raise DataError(f"mix.json counts {n} sequences of {name!r}, its shards hold {starts[-1]}")
        self.train_sequences = train_sequence_counts(plan, heldout_fraction)

    def rows(self, source: np.ndarray, index: np.ndarray) -> np.ndarray:
        """Sequences ``[n, seq_len + 1]`` (int64) addressed by (source, sequence index)."""
        out = np.empty((len(source), self.seq_len + 1), np.int64)
        for i, (s, k) in enumerate(zip(source.tolist(), index.tolist(), strict=True)):
            shard = int(np.searchsorted(self._starts[s], k, side="right")) - 1
            out[i] = self._shards[s][shard][k - self._starts[s][shard]]
        return out

    def heldout_ids(self, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``limit`` held-out (source, index) pairs, taken round-robin over the sources."""
        per_source = [
            np.arange(t, n) for t, n in zip(self.train_sequences, self.plan.source_sequences, strict=True)
        ]
        pairs = [
            (s, int(ids[j]))
            for j in range(max((len(ids) for ids in per_source), default=0))
            for s, ids in enumerate(per_source)
            if j < len(ids)
        ][:limit]
        return np.asarray([p[0] for p in pairs], np.int64), np.asarray([p[1] for p in pairs], np.int64)


def batch_positions(
    dataset: TokenDataset, cursor: int, count: int, skipped: list[tuple[int, int]]
) -> tuple[np.ndarray, int]:
    """The next ``count`` training positions at or after ``cursor``, and the cursor after them."""
    plan, taken = dataset.plan, []
    need, scan = count, cursor
    while need:
        if scan >= plan.total_samples:
            raise DataError(
                f"the mix plan holds {plan.total_samples} samples and this run needs more: lower the "
                "steps or the global batch, or publish a mix with a larger budget"
            )
        window = np.arange(scan, min(scan + need + need // 8 + 16, plan.total_samples), dtype=np.int64)
        source, _, index = plan.locate(window)
        keep = index < dataset.train_sequences[source]
        for start, stop in skipped:
            keep &= (window < start) | (window >= stop)
        chosen = window[keep][:need]
        taken.append(chosen)
        need -= len(chosen)
        scan = int(chosen[-1]) + 1 if need == 0 else int(window[-1]) + 1
    return np.concatenate(taken), scan


@dataclass
class Batch:
    """One optimizer step's data on this rank."""

    start: int  # cursor before the batch: the window [start, end) is what a rollback skips
    end: int
    positions: np.ndarray  # the global batch, every rank's samples, in chunk order
    tokens: torch.Tensor  # [accumulation, micro_batch, seq_len + 1] of this rank
    source: np.ndarray  # this rank's samples, flattened in micro-step order
    index: np.ndarray


class Loader:
    """This rank's batches, assembled ahead on a background thread (a stateful iterator).

    ``state_dict`` is the position after the last batch handed out (not the producer's),
    plus the skipped windows, so a checkpoint resumes exactly at the next unseen batch.
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
    ):
        self.dataset = dataset
        self.global_batch = global_batch
        self.micro_batch = micro_batch
        self.rank = rank
        self.world_size = world_size
        self.accumulation = global_batch // (micro_batch * world_size)
        self.prefetch = prefetch
        self.pin_memory = pin_memory
        self.cursor = 0
        self.skipped: list[tuple[int, int]] = []
        self.wait_seconds = 0.0  # time the last next_batch() waited for data
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
        chunks = positions.reshape(self.accumulation, self.world_size, self.micro_batch)
        return chunks[:, self.rank].reshape(-1)

    def _produce(self, cursor: int, skipped: list[tuple[int, int]]) -> None:
        try:
            while not self._stop.is_set():
                positions, end = batch_positions(self.dataset, cursor, self.global_batch, skipped)
                mine = self.my_slice(positions)
                source, _, index = self.dataset.plan.locate(mine)
                rows = torch.from_numpy(self.dataset.rows(source, index))
                tokens = rows.view(self.accumulation, self.micro_batch, -1)
                if self.pin_memory:
                    tokens = tokens.pin_memory()
                item = Batch(cursor, end, positions, tokens, source, index)
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                cursor = end
        except BaseException as exc:  # handed to the consumer, which raises it
            self._queue.put(exc)

    def next_batch(self) -> Batch:
        if self._thread is None:
            self._queue = queue.Queue(maxsize=self.prefetch)
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._produce, args=(self.cursor, list(self.skipped)), name="loader", daemon=True
            )
            self._thread.start()
        started = time.perf_counter()
        item = self._queue.get()
        self.wait_seconds = time.perf_counter() - started
        if isinstance(item, BaseException):
            self.close()
            raise item
        self.cursor = item.end
        return item

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            while self._thread.is_alive():
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    self._thread.join(timeout=0.05)
            self._thread = None


def open_dataset(
    repo: DataRepo,
    repo_spec: str,
    commit: str,
    cache: ShardCache,
    heldout_fraction: float,
    fetch: bool,
    barrier: Callable[[], None],
) -> tuple[DataBinding, TokenDataset]:
    """Bind to ``commit``: read its manifest and mix, make sure its shards are cached and verified.

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
    paths = {e.name: cache.path_for(e.sha256) for e in entries}
    missing = [name for name, p in paths.items() if not p.exists()]
    if missing:
        raise DataError(f"shards missing from the cache after fetching: {', '.join(missing[:5])}")
    return binding, TokenDataset(manifest, plan, paths, heldout_fraction)


def describe_samples(dataset: TokenDataset, batch: Batch) -> dict:
    """This rank's samples of a batch as JSON-ready ids (the sample log of the elastic test)."""
    names = dataset.plan.source_names
    return {
        "positions": [int(p) for p in batch.positions],
        "samples": [
            f"{names[s]}/{k}" for s, k in zip(batch.source.tolist(), batch.index.tolist(), strict=True)
        ],
    }


def train_sequence_counts(plan: MixPlan, heldout_fraction: float) -> np.ndarray:
    """Per source, the sequences training reads: all but the held-out tail.

    The tail is contiguous, so at most one document per source straddles the boundary
    between training and evaluation sequences.
    """
    sequences = np.asarray(plan.source_sequences, np.int64)
    heldout = np.where(sequences >= 2, np.ceil(sequences * heldout_fraction), 0).astype(np.int64)
    return sequences - heldout
