"""The sample space of one dataset commit, without PyTorch: binding, sequences, sample order.

This module, :mod:`training.shard_cache`, :mod:`training.streaming` and the loader process
(:mod:`training.loader_process`) never import torch (import-linter checks), so a loader
process starts in a fraction of a second.

* :func:`read_binding` reads the commit's manifest and mix plan and names what it is.
* :class:`TokenDataset` addresses every sequence of the commit by (source, index). It maps
  an index to its shard from the manifest alone; the shard's rows come from a provider
  (``shard_array``): a file of a full download, or a shard streamed into the bounded cache.
* :func:`batch_positions` is the sample order: a pure function of (mix plan, cursor,
  skipped windows). Global position ``p`` maps through ``MixPlan.locate`` (the shared blend
  and its per-source, per-epoch seeded permutations) to (source, sequence). Positions that
  land on a held-out sequence (the tail of each source, kept for evaluation) or in a
  skipped window are passed over. Nothing depends on the world size: rank ``r`` of ``w``
  trains on chunks ``a*w + r`` of ``micro_batch`` samples of each global batch
  (:func:`rank_slice`), so any world size with the same global batch trains on the same
  samples in the same order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from formats import layout
from formats.mix import MixPlan
from formats.shards import Manifest, ShardEntry
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


def _read_object(repo: DataRepo, commit: str, path: str, what: str) -> bytes:
    try:
        return repo.get(commit, path)
    except NotFound:
        raise DataError(f"commit {commit} has no {path}: it holds no published {what}") from None


@dataclass(frozen=True)
class CommitFiles:
    """The small files that define a commit's sample space, as bytes (a loader process gets these)."""

    manifest: bytes
    mix: bytes
    tokenizer_sha256: str


def read_commit_files(repo: DataRepo, commit: str) -> CommitFiles:
    manifest = _read_object(repo, commit, layout.MANIFEST, "shard manifest")
    mix = _read_object(repo, commit, layout.MIX, "mix plan (mix.json)")
    try:
        tokenizer_sha = hashlib.sha256(repo.get(commit, layout.TOKENIZER)).hexdigest()
    except NotFound:
        tokenizer_sha = ""
    return CommitFiles(manifest, mix, tokenizer_sha)


def bind(files: CommitFiles, repo_spec: str, commit: str) -> tuple[DataBinding, Manifest, MixPlan]:
    """Parse and cross-check a commit's manifest and mix plan; name them in a binding."""
    manifest = Manifest.from_json(files.manifest)
    plan = MixPlan.from_json(files.mix)
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
        manifest_sha256=hashlib.sha256(files.manifest).hexdigest(),
        mix_sha256=hashlib.sha256(files.mix).hexdigest(),
        tokenizer_sha256=files.tokenizer_sha256,
    )
    return binding, manifest, plan


def read_binding(repo: DataRepo, repo_spec: str, commit: str) -> tuple[DataBinding, Manifest, MixPlan]:
    """Manifest, mix plan and the binding of ``commit`` (small files; read on every rank)."""
    return bind(read_commit_files(repo, commit), repo_spec, commit)


ShardArray = Callable[[int], np.ndarray]
"""Shard number (its place in :attr:`TokenDataset.entries`) -> its ``[sequences, seq_len + 1]`` rows."""


class TokenDataset:
    """Every sequence of the commit's sources, addressed by (source, index), plus the held-out split.

    Shards are numbered in the order of :attr:`entries` (sources in the mix plan's order,
    then the manifest's shard order); :meth:`shard_numbers` maps sequences to them from
    the manifest's sequence counts, so the sample order's shards are known before any
    shard is local. ``shard_array`` gives a shard's rows when they are needed.
    """

    def __init__(self, manifest: Manifest, plan: MixPlan, heldout_fraction: float, shard_array: ShardArray):
        self.manifest = manifest
        self.plan = plan
        self.seq_len = manifest.seq_len
        self.shard_array = shard_array
        self.entries: list[ShardEntry] = []
        self._first_shard: list[int] = []  # per source: the number of its first shard
        self._starts: list[np.ndarray] = []  # per source: first sequence index of each shard, and the total
        for name, count in zip(plan.source_names, plan.source_sequences, strict=True):
            shards = manifest.shards_of(name)
            self._first_shard.append(len(self.entries))
            self.entries += shards
            starts = np.cumsum([0] + [e.sequences for e in shards]).astype(np.int64)
            if starts[-1] != count:
                raise DataError(
                    f"mix.json counts {count} sequences of {name!r}, its shards hold {starts[-1]}"
                )
            self._starts.append(starts)
        self.train_sequences = train_sequence_counts(plan, heldout_fraction)
        self._kept: dict[tuple[int, int], np.ndarray] = {}

    def shard_numbers(self, source: np.ndarray, index: np.ndarray) -> np.ndarray:
        """The shard number holding each (source, index)."""
        out = np.empty(len(source), np.int64)
        for s in np.unique(source).tolist():
            mask = source == s
            out[mask] = self._first_shard[s] + np.searchsorted(self._starts[s], index[mask], side="right") - 1
        return out

    def rows(self, source: np.ndarray, index: np.ndarray) -> np.ndarray:
        """Sequences ``[n, seq_len + 1]`` (int64) addressed by (source, sequence index)."""
        out = np.empty((len(source), self.seq_len + 1), np.int64)
        shards = self.shard_numbers(source, index)
        for i, (s, k, shard) in enumerate(zip(source.tolist(), index.tolist(), shards.tolist(), strict=True)):
            kept = self._kept.get((s, k))
            if kept is not None:
                out[i] = kept
                continue
            out[i] = self.shard_array(shard)[k - self._starts[s][shard - self._first_shard[s]]]
        return out

    def keep_rows(self, source: np.ndarray, index: np.ndarray) -> None:
        """Hold these rows in memory from now on (the held-out evaluation set: a few MB at most),
        so that evaluating never waits on the shard cache."""
        for s, k, row in zip(source.tolist(), index.tolist(), self.rows(source, index), strict=True):
            self._kept[(s, k)] = row

    def check_shard(self, shard: int, rows: np.ndarray) -> np.ndarray:
        """``rows`` of shard ``shard`` if their shape is the manifest's, else a DataError naming it."""
        entry = self.entries[shard]
        if rows.shape != (entry.sequences, self.seq_len + 1):
            raise DataError(
                f"shard {entry.name} holds {rows.shape[0]} sequences of {rows.shape[1] - 1} tokens but "
                f"shards/manifest.json says {entry.sequences} of {self.seq_len}: the commit is inconsistent"
            )
        return rows

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
    dataset, cursor: int, count: int, skipped: list[tuple[int, int]]
) -> tuple[np.ndarray, int]:
    """The next ``count`` training positions at or after ``cursor``, and the cursor after them.

    ``dataset`` needs ``plan`` and ``train_sequences`` (a :class:`TokenDataset`, or the
    lineage queries' lighter stand-in)."""
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


def samples_per_source(
    plan: MixPlan, heldout_fraction: float, cursor: int, skipped: list[tuple[int, int]], chunk: int = 1 << 20
) -> np.ndarray:
    """Per source of ``plan``, the training samples at positions before ``cursor``: what
    :func:`batch_positions` gave a run whose loader stands at ``cursor`` with windows ``skipped``
    (held-out sequences and skipped windows are not trained on). Counted ``chunk`` positions at a time."""
    train_sequences = train_sequence_counts(plan, heldout_fraction)
    counts = np.zeros(len(plan.source_names), np.int64)
    for start in range(0, min(cursor, plan.total_samples), chunk):
        window = np.arange(start, min(start + chunk, cursor, plan.total_samples), dtype=np.int64)
        source, _, index = plan.locate(window)
        keep = index < train_sequences[source]
        for low, high in skipped:
            keep &= (window < low) | (window >= high)
        counts += np.bincount(source[keep], minlength=len(counts))
    return counts


def rank_slice(positions: np.ndarray, rank: int, world_size: int, micro_batch: int) -> np.ndarray:
    """Rank ``rank``'s samples of a global batch: chunks ``a*world + rank``, in micro-step order."""
    accumulation = len(positions) // (micro_batch * world_size)
    return positions.reshape(accumulation, world_size, micro_batch)[:, rank].reshape(-1)


def train_sequence_counts(plan: MixPlan, heldout_fraction: float) -> np.ndarray:
    """Per source, the sequences training reads: all but the held-out tail.

    The tail is contiguous, so at most one document per source straddles the boundary
    between training and evaluation sequences.
    """
    sequences = np.asarray(plan.source_sequences, np.int64)
    heldout = np.where(sequences >= 2, np.ceil(sequences * heldout_fraction), 0).astype(np.int64)
    return sequences - heldout
