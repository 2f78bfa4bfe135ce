"""Pure packing logic: document weights to repeat counts, EOD insertion, rows, balanced shards.

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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from formats.shards import ShardHeader, ShardWriter
from tasks.tokenize import sample_key

INVALID_WEIGHT = -1


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
