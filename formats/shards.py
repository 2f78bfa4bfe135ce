"""Shard files and the shard manifest, shared by the shard stage (writer) and the trainer (reader).

File ``shards/<source>/shard-NNNNN.bin``: a 64-byte little-endian header, then the body.

Header: magic ``b"TLSHARD1"`` (8 bytes), version u32 (= 1), dtype code u32 (2 = uint16,
4 = uint32), seq_len u32, eod_token u32, num_sequences u64, zero bytes up to 64.
Body: ``num_sequences * (seq_len + 1)`` tokens of that dtype, row-major; row i holds the
tokens ``[i*(seq_len+1), (i+1)*(seq_len+1))`` of the source's token stream (inputs =
``row[:-1]``, targets = ``row[1:]``). Rows do not overlap.

Packing (standard GPT packing): a source's token stream is its documents in order, each
followed by exactly one end-of-document (EOD) token, cut into rows of ``seq_len + 1``
tokens. A row may start in the middle of a document that began in the previous row (or
the previous shard), and a row may hold several documents. The tokenizer never emits EOD
inside a document (special tokens in text are encoded as plain text) and documents with no
tokens are not packed, so in a valid stream:

* two EOD tokens are never adjacent, inside a row, across rows, or across shards;
* the stream of a source never starts with EOD;
* the number of EOD tokens in a shard equals the manifest's ``documents`` for that shard
  (the documents that end in that shard).

The last, incomplete row of a source is dropped (fewer than ``seq_len + 1`` tokens per
source; the shard stage reports how many), so a source's stream need not end with EOD.
:func:`verify_shard` checks all of this.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import struct
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

from formats import layout

MAGIC = b"TLSHARD1"
FORMAT_VERSION = 1
HEADER_SIZE = 64
_HEADER = struct.Struct("<8sIIIIQ")  # magic, version, dtype code, seq_len, eod_token, num_sequences
_DTYPE_BY_CODE = {2: np.dtype("<u2"), 4: np.dtype("<u4")}
_CODE_BY_NAME = {"uint16": 2, "uint32": 4}
UINT16_VOCAB_LIMIT = 1 << 16  # token ids 0..65535 fit uint16
_READ_CHUNK_BYTES = 8 << 20


class ShardFormatError(ValueError):
    """A shard file or header that does not follow the format; the message says why."""


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """uint16 when every token id (< vocab_size) fits, else uint32."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be at least 1, got {vocab_size}")
    if vocab_size > 1 << 32:
        raise ValueError(f"vocab_size {vocab_size} does not fit uint32 token ids")
    return np.dtype("<u2") if vocab_size <= UINT16_VOCAB_LIMIT else np.dtype("<u4")


def _shard_dtype(dtype: np.dtype | str | type) -> np.dtype:
    dt = np.dtype(dtype).newbyteorder("<")
    if dt.name not in _CODE_BY_NAME:
        raise ShardFormatError(f"shard dtype must be uint16 or uint32, got {np.dtype(dtype).name}")
    return dt


@dataclass(frozen=True)
class ShardHeader:
    dtype: np.dtype
    seq_len: int
    eod_token: int
    num_sequences: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _shard_dtype(self.dtype))
        if not 1 <= self.seq_len < 1 << 32:
            raise ShardFormatError(f"seq_len must be between 1 and 2**32-1, got {self.seq_len}")
        if not 0 <= self.eod_token <= np.iinfo(self.dtype).max:
            raise ShardFormatError(f"eod_token {self.eod_token} does not fit {self.dtype.name}")
        if not 0 <= self.num_sequences < 1 << 64:
            raise ShardFormatError(f"num_sequences must be non-negative, got {self.num_sequences}")

    @property
    def row_len(self) -> int:
        """Tokens per stored sequence: seq_len inputs plus one shifted target."""
        return self.seq_len + 1

    @property
    def body_bytes(self) -> int:
        return self.num_sequences * self.row_len * self.dtype.itemsize

    @property
    def file_bytes(self) -> int:
        return HEADER_SIZE + self.body_bytes

    def pack(self) -> bytes:
        fields = _HEADER.pack(
            MAGIC,
            FORMAT_VERSION,
            _CODE_BY_NAME[self.dtype.name],
            self.seq_len,
            self.eod_token,
            self.num_sequences,
        )
        return fields.ljust(HEADER_SIZE, b"\0")

    @classmethod
    def unpack(cls, data: bytes) -> ShardHeader:
        if len(data) < HEADER_SIZE:
            raise ShardFormatError(f"file is {len(data)} bytes, shorter than the {HEADER_SIZE}-byte header")
        magic, version, code, seq_len, eod_token, num_sequences = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise ShardFormatError(f"bad magic {magic!r}, expected {MAGIC!r}: not a tokenlake shard")
        if version != FORMAT_VERSION:
            raise ShardFormatError(
                f"unsupported shard format version {version} (this code reads {FORMAT_VERSION})"
            )
        if code not in _DTYPE_BY_CODE:
            raise ShardFormatError(f"unknown dtype code {code} (2 = uint16, 4 = uint32)")
        if any(data[_HEADER.size : HEADER_SIZE]):
            raise ShardFormatError("reserved header bytes are not zero")
        return cls(_DTYPE_BY_CODE[code], seq_len, eod_token, num_sequences)


class ShardWriter:
    """Streams one shard whose sequence count is known up front (no seek needed).

    ``write`` takes ``[k, seq_len + 1]`` row blocks; ``close`` checks that exactly
    ``header.num_sequences`` rows came and returns the sha256 of the whole file.
    A path target is written to a temporary file and renamed into place on success.
    """

    def __init__(self, target: str | os.PathLike[str] | BinaryIO, header: ShardHeader):
        self.header = header
        self.rows_written = 0
        self._hash = hashlib.sha256()
        self._final_path: Path | None = None
        if isinstance(target, str | os.PathLike):
            self._final_path = Path(target)
            fd, tmp = tempfile.mkstemp(dir=self._final_path.parent, prefix=f".{self._final_path.name}.")
            self._tmp_path = Path(tmp)
            self._file: BinaryIO = os.fdopen(fd, "wb")
        else:
            self._file = target
        self._emit(header.pack())

    def _emit(self, data: bytes | memoryview) -> None:
        self._hash.update(data)
        self._file.write(data)

    def write(self, rows: np.ndarray) -> None:
        if rows.ndim != 2 or rows.shape[1] != self.header.row_len:
            raise ShardFormatError(f"rows must have shape [k, {self.header.row_len}], got {list(rows.shape)}")
        if self.rows_written + rows.shape[0] > self.header.num_sequences:
            raise ShardFormatError(f"more rows than the {self.header.num_sequences} the header declares")
        if rows.dtype != self.header.dtype:
            if rows.size and (rows.min() < 0 or rows.max() > np.iinfo(self.header.dtype).max):
                raise ShardFormatError(f"token ids out of range for {self.header.dtype.name}")
            rows = rows.astype(self.header.dtype)
        if rows.size:
            self._emit(memoryview(np.ascontiguousarray(rows)).cast("B"))
        self.rows_written += rows.shape[0]

    def close(self) -> str:
        """Finish the shard; returns the sha256 hex of the file (header and body)."""
        try:
            if self.rows_written != self.header.num_sequences:
                raise ShardFormatError(
                    f"shard got {self.rows_written} rows but its header declares {self.header.num_sequences}"
                )
            if self._final_path is not None:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()
                os.replace(self._tmp_path, self._final_path)
        except BaseException:
            self.abort()
            raise
        return self._hash.hexdigest()

    def abort(self) -> None:
        if self._final_path is not None:
            self._file.close()
            self._tmp_path.unlink(missing_ok=True)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is not None:
            self.abort()


def write_shard(target: str | os.PathLike[str] | BinaryIO, sequences: np.ndarray, eod_token: int) -> str:
    """Write ``sequences`` (``[n, seq_len + 1]``, uint16 or uint32) as one shard; returns its sha256 hex."""
    if sequences.ndim != 2 or sequences.shape[1] < 2:
        raise ShardFormatError(
            f"sequences must have shape [n, seq_len + 1] with seq_len >= 1, got {list(sequences.shape)}"
        )
    header = ShardHeader(sequences.dtype, sequences.shape[1] - 1, eod_token, sequences.shape[0])
    writer = ShardWriter(target, header)
    with writer:
        writer.write(sequences)
        return writer.close()


def read_shard(path: str | os.PathLike[str]) -> tuple[ShardHeader, np.ndarray]:
    """The header and a read-only ``[n, seq_len + 1]`` memmap of the body; checks the size."""
    path = Path(path)
    with path.open("rb") as f:
        header = ShardHeader.unpack(f.read(HEADER_SIZE))
    size = path.stat().st_size
    if size != header.file_bytes:
        raise ShardFormatError(
            f"{path.name}: file is {size} bytes but its header ({header.num_sequences} sequences) "
            f"implies {header.file_bytes}: {'truncated' if size < header.file_bytes else 'trailing bytes'}"
        )
    shape = (header.num_sequences, header.row_len)
    if header.num_sequences == 0:  # mmap cannot map zero bytes
        return header, np.empty(shape, header.dtype)
    return header, np.memmap(path, dtype=header.dtype, mode="r", offset=HEADER_SIZE, shape=shape)


def read_shard_bytes(data: bytes) -> tuple[ShardHeader, np.ndarray]:
    """Like :func:`read_shard`, for a shard already in memory (e.g. fetched from the repository)."""
    header = ShardHeader.unpack(data[:HEADER_SIZE])
    if len(data) != header.file_bytes:
        raise ShardFormatError(f"shard is {len(data)} bytes but its header implies {header.file_bytes}")
    body = np.frombuffer(data, dtype=header.dtype, offset=HEADER_SIZE)
    return header, body.reshape(header.num_sequences, header.row_len)


# --- manifest -------------------------------------------------------------------------------

SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


class ShardEntry(BaseModel):
    """One shard in the manifest. ``tokens`` = stored tokens = sequences * (seq_len + 1);
    ``documents`` = EOD tokens in the shard (documents that end in it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str  # repository path, e.g. shards/web/shard-00000.bin
    source: str
    sha256: str = Field(pattern=SHA256_HEX.pattern)
    sequences: int = Field(ge=0)
    tokens: int = Field(ge=0)
    bytes: int = Field(ge=HEADER_SIZE)
    documents: int = Field(default=0, ge=0)


MANIFEST_INVARIANTS: dict[str, str] = {
    "has_shards": "a dataset version without shards cannot be trained on",
    "no_empty_shard": "no empty shard",
    "balanced_sources": "shards of one source differ by at most one sequence, so no rank waits on a fat shard",
    "unique_names": "every shard listed once",
    "shard_paths": "shards live at shards/<source>/shard-NNNNN.bin",
    "checksums": "every shard carries its sha256",
    "tokens_per_sequence": "tokens = sequences * (seq_len + 1)",
    "file_sizes": "file size = 64-byte header + tokens * dtype size",
    "source_sequences": "per-source sequence totals add up",
    "source_tokens": "per-source token totals add up",
    "total_sequences": "total sequences add up",
    "total_tokens": "total tokens add up",
    "sources_have_shards": "the sources with shards are exactly the sources the manifest declares",
    "dtype_fits_vocabulary": "the token dtype is the one the vocabulary size calls for",
    "eod_in_vocabulary": "the end-of-document token is inside the vocabulary",
}
"""What a sound ``shards/manifest.json`` satisfies: the one list. :meth:`Manifest.broken` checks
it in Python (``tokenlake shards verify``); ``expectations/shard_manifest.json``
checks the same invariants as the shard stage's Great Expectations gate, each expectation naming
its invariant in ``meta.invariant`` (``tests/tasks/test_manifest_invariants.py`` holds the two
to each other)."""


class SourceTotals(TypedDict):
    """Plain dict ``{sequences, tokens}``, as ``formats.mix.resolve_mix`` takes it."""

    sequences: int
    tokens: int


class Manifest(BaseModel):
    """``shards/manifest.json``: every shard of a dataset version and the totals.

    Shards are listed by source (sorted), then by shard index; sequence index ``s`` of a
    source is the ``s``-th row of that source's shards in this order. ``sources`` and
    ``totals`` are plain dicts. :meth:`faults` lists what breaks :data:`MANIFEST_INVARIANTS`
    (the Great Expectations suite of the shard stage checks the same and gates publishing).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = FORMAT_VERSION
    seq_len: int = Field(ge=1)
    dtype: Literal["uint16", "uint32"]
    vocab_size: int = Field(ge=1)
    eod_token: int = Field(ge=0)
    tokenizer_sha256: str
    input_commit: str
    shards: list[ShardEntry] = Field(default_factory=list)
    sources: dict[str, SourceTotals] = Field(default_factory=dict)
    totals: SourceTotals = Field(default_factory=lambda: SourceTotals(sequences=0, tokens=0))

    @classmethod
    def build(cls, shards: Iterable[ShardEntry], **fields: object) -> Manifest:
        """A manifest whose ``sources`` and ``totals`` are summed from ``shards``."""
        entries = sorted(shards, key=lambda e: (e.source, e.name))
        sources: dict[str, SourceTotals] = {}
        for e in entries:
            s = sources.setdefault(e.source, SourceTotals(sequences=0, tokens=0))
            s["sequences"] += e.sequences
            s["tokens"] += e.tokens
        totals = SourceTotals(
            sequences=sum(s["sequences"] for s in sources.values()),
            tokens=sum(s["tokens"] for s in sources.values()),
        )
        return cls(shards=entries, sources=sources, totals=totals, **fields)

    @property
    def numpy_dtype(self) -> np.dtype:
        return np.dtype(self.dtype).newbyteorder("<")

    def shards_of(self, source: str) -> list[ShardEntry]:
        return [e for e in self.shards if e.source == source]

    def broken(self) -> list[tuple[str, str]]:
        """``(invariant, what is wrong)`` for every broken :data:`MANIFEST_INVARIANTS` entry."""
        found: list[tuple[str, str]] = []
        if not self.shards:
            found.append(("has_shards", "the manifest lists no shard"))
        if self.numpy_dtype != dtype_for_vocab(self.vocab_size):
            found.append(
                ("dtype_fits_vocabulary", f"dtype {self.dtype} does not match vocab_size {self.vocab_size}")
            )
        if self.eod_token >= self.vocab_size:
            found.append(
                (
                    "eod_in_vocabulary",
                    f"eod_token {self.eod_token} is outside the vocabulary ({self.vocab_size})",
                )
            )
        row_len = self.seq_len + 1
        for e in self.shards:
            if e.sequences == 0:
                found.append(("no_empty_shard", f"{e.name}: empty shard"))
            if not layout.SHARD_PATH.match(e.name):
                found.append(("shard_paths", f"{e.name}: not a shards/<source>/shard-NNNNN.bin path"))
            if not SHA256_HEX.match(e.sha256):
                found.append(("checksums", f"{e.name}: sha256 {e.sha256!r} is not 64 hex digits"))
            if e.tokens != e.sequences * row_len:
                found.append(
                    (
                        "tokens_per_sequence",
                        f"{e.name}: tokens {e.tokens} != sequences {e.sequences} * {row_len}",
                    )
                )
            if e.bytes != HEADER_SIZE + e.tokens * self.numpy_dtype.itemsize:
                found.append(
                    ("file_sizes", f"{e.name}: bytes {e.bytes} do not match {e.tokens} {self.dtype} tokens")
                )
        names = [e.name for e in self.shards]
        if len(set(names)) != len(names):
            found.append(("unique_names", "shard names are not unique"))
        rebuilt = Manifest.build(self.shards, **self._fields())
        if set(rebuilt.sources) != set(self.sources):
            found.append(
                (
                    "sources_have_shards",
                    f"sources with shards {sorted(rebuilt.sources)} != declared {sorted(self.sources)}",
                )
            )
        for source, summed in sorted(rebuilt.sources.items()):
            declared = self.sources.get(source, {"sequences": -1, "tokens": -1})
            for unit in ("sequences", "tokens"):
                if declared[unit] != summed[unit]:
                    found.append(
                        (
                            f"source_{unit}",
                            f"source {source}: {unit} {declared[unit]} != sum of its shards {summed[unit]}",
                        )
                    )
            counts = [e.sequences for e in self.shards_of(source)]
            if max(counts) - min(counts) > 1:
                found.append(
                    (
                        "balanced_sources",
                        f"source {source}: shard sizes {min(counts)}..{max(counts)} differ by more than one sequence",
                    )
                )
        for unit in ("sequences", "tokens"):
            if self.totals[unit] != rebuilt.totals[unit]:
                found.append(
                    (
                        f"total_{unit}",
                        f"totals: {unit} {self.totals[unit]} != sum of shards {rebuilt.totals[unit]}",
                    )
                )
        return found

    def faults(self) -> list[str]:
        """Every inconsistency between entries, per-source sums and totals (empty when sound)."""
        return [what for _, what in self.broken()]

    def _fields(self) -> dict[str, object]:
        return self.model_dump(exclude={"shards", "sources", "totals"})

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, 2-space indent): the bytes of ``shards/manifest.json``."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        return cls.model_validate_json(text)

    def sha256(self) -> str:
        """sha256 hex of :meth:`to_json` (equal to the file's sha256 when written with it)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()


# --- verification ---------------------------------------------------------------------------


@dataclass
class ShardCheck:
    """What :func:`verify_shard` found in one shard; ``ok`` when ``faults`` is empty."""

    name: str
    faults: list[str] = field(default_factory=list)
    sequences: int = 0
    documents: int = 0
    bytes: int = 0
    sha256: str = ""
    last_token: int | None = None  # pass to the next shard of the same source

    @property
    def ok(self) -> bool:
        return not self.faults


def verify_shard(
    stream: BinaryIO,
    name: str,
    expected: ShardEntry | None = None,
    manifest: Manifest | None = None,
    previous_token: int | None = None,
    starts_source: bool = False,
) -> ShardCheck:
    """Re-read a shard from ``stream`` and check header, size, checksum and EOD placement.

    With ``expected``/``manifest``, the header, size, sha256 and EOD count must match them and
    every token must be inside the vocabulary. ``previous_token`` is the last token of the
    previous shard of the same source (adjacent EODs across shards are a fault);
    ``starts_source`` says this is the source's first shard (it must not start with EOD).
    Faults are collected, not raised: a broken shard never stops the check of the others.
    """
    check = ShardCheck(name)
    digest = hashlib.sha256()
    head = _read_exactly(stream, HEADER_SIZE)
    digest.update(head)
    check.bytes = len(head)
    try:
        header = ShardHeader.unpack(head)
    except ShardFormatError as exc:
        check.faults.append(f"header: {exc}")
        header = None
    if header is not None and manifest is not None:
        for what, got, want in (
            ("seq_len", header.seq_len, manifest.seq_len),
            ("dtype", header.dtype.name, manifest.dtype),
            ("eod_token", header.eod_token, manifest.eod_token),
        ):
            if got != want:
                check.faults.append(f"header {what} {got} != manifest {want}")
    if header is not None and expected is not None and header.num_sequences != expected.sequences:
        check.faults.append(f"header says {header.num_sequences} sequences, manifest {expected.sequences}")

    eod = header.eod_token if header is not None else None
    previous = previous_token
    first_token: int | None = None
    max_token = -1
    adjacent_eods = False
    itemsize = header.dtype.itemsize if header is not None else 1
    carry = b""
    while chunk := stream.read(_READ_CHUNK_BYTES):
        digest.update(chunk)
        check.bytes += len(chunk)
        if header is None:
            continue
        data = carry + chunk
        usable = len(data) - len(data) % itemsize
        carry = data[usable:]
        tokens = np.frombuffer(data[:usable], dtype=header.dtype)
        if tokens.size == 0:
            continue
        is_eod = tokens == eod
        check.documents += int(is_eod.sum())
        adjacent_eods |= (previous == eod and bool(is_eod[0])) or bool(np.any(is_eod[1:] & is_eod[:-1]))
        max_token = max(max_token, int(tokens.max()))
        first_token = int(tokens[0]) if first_token is None else first_token
        previous = int(tokens[-1])
    if starts_source and first_token is not None and first_token == eod:
        check.faults.append("the source's token stream starts with an end-of-document token")
    if adjacent_eods:
        check.faults.append("adjacent end-of-document tokens (an empty document or a corrupt body)")
    if manifest is not None and max_token >= manifest.vocab_size:
        check.faults.append(f"token id {max_token} is outside the vocabulary ({manifest.vocab_size})")
    check.last_token = previous
    check.sha256 = digest.hexdigest()
    if header is not None:
        check.sequences = header.num_sequences
        if check.bytes != header.file_bytes:
            state = "truncated" if check.bytes < header.file_bytes else "has trailing bytes"
            check.faults.append(f"{state}: {check.bytes} bytes, header implies {header.file_bytes}")
    if expected is not None:
        if check.bytes != expected.bytes:
            check.faults.append(f"size {check.bytes} bytes != manifest {expected.bytes}")
        if check.sha256 != expected.sha256:
            check.faults.append("sha256 does not match the manifest (the file changed since it was written)")
        if header is not None and check.documents != expected.documents:
            check.faults.append(
                f"{check.documents} end-of-document tokens, manifest says {expected.documents}"
            )
    return check


def _read_exactly(stream: BinaryIO, size: int) -> bytes:
    parts = []
    while size > 0 and (part := stream.read(size)):
        parts.append(part)
        size -= len(part)
    return b"".join(parts)


def shard_bytes(sequences: np.ndarray, eod_token: int) -> bytes:
    """A whole shard as bytes (small shards, tests)."""
    buffer = io.BytesIO()
    write_shard(buffer, sequences, eod_token)
    return buffer.getvalue()
