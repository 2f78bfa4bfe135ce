"""The shard stage's pure core: document weights to repeat counts, EOD insertion, rows, balanced
shards, and :func:`pack_source`, one source's documents into rows.

How soft-dedup weights reach training: by deterministic repetition. A document of weight
``w`` is emitted ``floor(w)`` times, plus once more when ``u < w - floor(w)``, where
``u = sample_key(seed, id) / 2**64`` is uniform in [0, 1). Its expected token mass is
therefore ``w * tokens``: a near-duplicate with weight 0.25 survives in a quarter of the
clusters' members, a weight above 1 repeats. Copies after the first come in later passes
over the source (pass ``k`` emits the documents repeated at least ``k`` times), so the
copies of a document are far apart in the stream rather than adjacent.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from formats.shards import ShardHeader, ShardWriter
from tasks.parts import iter_batches
from tasks.schema import with_quarantine_reason
from tasks.shard.config import ShardConfig
from tasks.stage import DocumentCounts
from tasks.tokenize import Encoder, sample_key

STAGE = "shard"
INVALID_WEIGHT = -1
SAMPLED_OUT = "sampled_out_by_weight"  # the one reason a document has no quarantine row: only counted


def repeat_counts(table: pa.Table, seed: int, max_repeats: int) -> np.ndarray:
    """How many times each document is emitted; :data:`INVALID_WEIGHT` for a null, NaN,
    infinite or negative weight. A table without a ``weight`` column has weight 1.0 everywhere."""
    n = table.num_rows
    if "weight" not in table.column_names:
        return np.ones(n, np.int64)
    weight_column = table.column("weight").cast(pa.float64())
    valid = pc.fill_null(pc.is_finite(weight_column), False).to_numpy(zero_copy_only=False)
    weights = pc.fill_null(weight_column, -1.0).to_numpy(zero_copy_only=False).astype(np.float64)
    valid &= weights >= 0
    weights = np.where(valid, np.minimum(weights, max_repeats), 0.0)
    whole = np.floor(weights)
    fraction = weights - whole
    ids = table.column("id").to_pylist()
    uniform = np.fromiter((sample_key(seed, i) for i in ids), np.float64, count=n) / 2.0**64
    counts = whole.astype(np.int64) + (uniform < fraction)
    return np.where(valid, counts, INVALID_WEIGHT)


def with_eod(ids: np.ndarray, lengths: np.ndarray, eod: int, dtype: np.dtype) -> np.ndarray:
    """The documents' tokens, each followed by one ``eod``: the packed stream of a batch."""
    ends = np.cumsum(lengths + 1) - 1
    stream = np.empty(ids.size + lengths.size, dtype)
    is_token = np.ones(stream.size, bool)
    is_token[ends] = False
    stream[is_token] = ids
    stream[ends] = eod
    return stream


class Packer:
    """Cuts a token stream fed in pieces into rows of ``row_len`` tokens; keeps the remainder."""

    def __init__(self, row_len: int, dtype: np.dtype):
        self.row_len = row_len
        self._carry = np.empty(0, dtype)

    def add(self, stream: np.ndarray) -> np.ndarray:
        """The complete rows now available, ``[k, row_len]``."""
        joined = np.concatenate([self._carry, stream]) if self._carry.size else stream
        full = joined.size // self.row_len * self.row_len
        self._carry = joined[full:].copy()
        return joined[:full].reshape(-1, self.row_len)

    @property
    def remainder(self) -> int:
        """Tokens of the last, incomplete row (dropped at the end of a source)."""
        return int(self._carry.size)


def balanced_sizes(sequences: int, max_per_shard: int) -> list[int]:
    """Shard sizes for ``sequences`` rows: as few shards as ``max_per_shard`` allows, sizes differing by at most one."""
    if sequences == 0:
        return []
    shards = math.ceil(sequences / max_per_shard)
    base, extra = divmod(sequences, shards)
    return [base + 1 if i < extra else base for i in range(shards)]


@dataclass
class WrittenShard:
    path: Path
    sequences: int
    documents: int  # EOD tokens
    bytes: int
    sha256: str


class RowSpill:
    """Rows of one source appended to a local file, then split into balanced shard files.

    Holding the rows on disk (not in memory) keeps memory bounded whatever the source size,
    and lets the shard sizes be balanced once the row count is known.
    """

    def __init__(self, path: Path, row_len: int, dtype: np.dtype):
        self.path = path
        self.row_len = row_len
        self.dtype = dtype
        self.rows = 0
        self._file = path.open("wb")

    def append(self, rows: np.ndarray) -> None:
        if rows.size:
            self._file.write(memoryview(np.ascontiguousarray(rows, self.dtype)).cast("B"))
            self.rows += rows.shape[0]

    def write_shards(
        self, out_dir: Path, eod: int, max_per_shard: int, block_rows: int = 16_384
    ) -> list[WrittenShard]:
        """Write ``shard-NNNNN.bin`` files into ``out_dir`` (balanced sizes) and remove the spill."""
        self._file.close()
        written: list[WrittenShard] = []
        if self.rows:
            rows = np.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.rows, self.row_len))
            start = 0
            for index, size in enumerate(balanced_sizes(self.rows, max_per_shard)):
                path = out_dir / f"shard-{index:05d}.bin"
                header = ShardHeader(self.dtype, self.row_len - 1, eod, size)
                documents = 0
                with ShardWriter(path, header) as writer:
                    for block_start in range(start, start + size, block_rows):
                        block = rows[block_start : min(block_start + block_rows, start + size)]
                        documents += int(np.count_nonzero(block == eod))
                        writer.write(block)
                    sha256 = writer.close()
                written.append(WrittenShard(path, size, documents, header.file_bytes, sha256))
                start += size
            del rows
        os.unlink(self.path)
        return written

    def discard(self) -> None:
        self._file.close()
        self.path.unlink(missing_ok=True)


# ---- one source ----------------------------------------------------------------------------


@dataclass
class SourceOutcome(DocumentCounts):
    """What packing one source did; ``reason`` says why a source produced no shard."""

    source: str = field(kw_only=True)
    repeated_copies: int = 0
    weights_clamped: int = 0
    text_bytes: int = 0
    stream_tokens: int = 0  # documents' tokens plus one EOD each, repeats included
    sequences: int = 0
    tail_tokens_dropped: int = 0
    encoder_fallbacks: int = 0  # documents re-encoded by tokenizers (tasks/tiktoken_bpe.py)
    reason: str = ""


def pack_source(
    source: str,
    read_tables: Callable[[int], Iterable[pa.Table]],
    encoder: Encoder,
    config: ShardConfig,
    spill: RowSpill,
    quarantine: Callable[[pa.Table], None],
) -> SourceOutcome:
    """Encode and pack one source's documents into ``spill``; pure over Arrow tables.

    ``read_tables(pass_number)`` gives the source's tables; it is called once per pass
    (more than once only when some weight asks for a repeat). Rows whose weight is invalid
    or that encode to no tokens go, with their reason, to ``quarantine``; sampled-out
    documents are only counted.
    """
    outcome = SourceOutcome(source=source)
    packer = Packer(config.seq_len + 1, spill.dtype)
    current = _Pass(1)
    while True:
        documents = _documents_of_pass(read_tables(current.number), current, config, outcome, quarantine)
        for table, encoded in encoder.map(documents, _texts):
            has_tokens = encoded.lengths > 0
            emitted = int(has_tokens.sum())
            if current.number == 1:
                outcome.kept += emitted
                outcome.encoder_fallbacks += encoded.fallbacks
                outcome.text_bytes += int(pc.sum(pc.binary_length(table.column("text"))).as_py() or 0)
                if emitted < table.num_rows:
                    outcome.reject("no_tokens", table.num_rows - emitted)
                    quarantine(_with_reason(table.filter(~has_tokens), "no_tokens"))
            else:
                outcome.repeated_copies += emitted
            stream = with_eod(encoded.ids, encoded.lengths[has_tokens], encoder.eod_id, spill.dtype)
            outcome.stream_tokens += stream.size
            spill.append(packer.add(stream))
        if not current.more_needed:
            break
        current = _Pass(current.number + 1)
    outcome.sequences = spill.rows
    outcome.tail_tokens_dropped = packer.remainder
    outcome.reason = _why_empty(outcome, config.seq_len)
    return outcome


@dataclass
class _Pass:
    number: int
    more_needed: bool = False  # some document repeats more than ``number`` times


def _documents_of_pass(
    tables: Iterable[pa.Table],
    current: _Pass,
    config: ShardConfig,
    outcome: SourceOutcome,
    quarantine: Callable[[pa.Table], None],
) -> Iterator[pa.Table]:
    """The documents emitted in this pass (repeat count >= pass number); counts rejects in pass 1."""
    for table in iter_batches(tables, config.batch_documents):
        counts = repeat_counts(table, config.weight_seed, config.max_repeats)
        current.more_needed |= bool(np.any(counts > current.number))
        if current.number == 1:
            outcome.documents_in += table.num_rows
            invalid = counts == INVALID_WEIGHT
            outcome.reject("invalid_weight", int(invalid.sum()))
            outcome.reject(SAMPLED_OUT, int((counts == 0).sum()))
            outcome.weights_clamped += _count_clamped(table, config.max_repeats)
            if invalid.any():
                quarantine(_with_reason(table.filter(invalid), "invalid_weight"))
        yield table.filter(counts >= current.number)


def _texts(table: pa.Table) -> list[str]:
    return pc.fill_null(table.column("text"), "").to_pylist()


def _with_reason(table: pa.Table, reason: str) -> pa.Table:
    return with_quarantine_reason(table, STAGE, [reason] * table.num_rows)


def _count_clamped(table: pa.Table, max_repeats: int) -> int:
    if "weight" not in table.column_names:
        return 0
    above = pc.greater(table.column("weight").cast(pa.float64()), float(max_repeats))
    return int(pc.sum(pc.fill_null(above, False).cast(pa.int64())).as_py() or 0)


def _why_empty(outcome: SourceOutcome, seq_len: int) -> str:
    if outcome.sequences:
        return ""
    if outcome.documents_in == 0:
        return "no documents"
    if outcome.kept == 0:
        reasons = ", ".join(f"{n} {r}" for r, n in sorted(outcome.rejected.items()))
        return f"all {outcome.documents_in} documents were rejected or sampled out ({reasons})"
    return f"only {outcome.stream_tokens} tokens, fewer than one sequence of {seq_len + 1}"
