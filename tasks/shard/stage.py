"""The shard stage without Prefect: tokenizer, per-source packing, manifest, gate, commit.

Input: ``dedup/<source>/part-*.parquet`` at the input commit. Output on the branch:
``tokenizer/tokenizer.json``, ``shards/<source>/shard-NNNNN.bin``, ``shards/manifest.json``,
``quarantine/shard/<source>/part-*.parquet`` (documents with an invalid weight or no
tokens), ``reports/shard.json``, and one commit whose metadata carries the tokenizer and
manifest sha256. The tokenizer is trained (or reused) and the shards are written in this
one stage, so a dataset version's shards and tokenizer always come from the same commit.

Memory is bounded by one Parquet part plus a few encoding batches: packed rows go to a
local spill file per source (see :class:`~tasks.shard.pack.RowSpill`).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from formats.shards import Manifest, ShardEntry, dtype_for_vocab
from tasks.io import (
    PartWriter,
    StageReport,
    StageResult,
    clear_prefix,
    commit_stage,
    config_hash,
    iter_batches,
    list_parts,
    list_sources,
    read_part,
    with_quarantine_reason,
)
from tasks.shard.config import ShardConfig
from tasks.shard.gate import gate_manifest
from tasks.shard.pack import INVALID_WEIGHT, Packer, RowSpill, repeat_counts, with_eod
from tasks.tokenize import TOKENIZER_PATH, Encoder, TokenizerError, TrainingSample, train_tokenizer
from tasks.tokenize import tokenizer_sha256 as sha256_of_tokenizer
from versioning import DataRepo, DiskFull, NotFound
from versioning.diskspace import disk_full_message, is_disk_full

STAGE = "shard"
INPUT_PREFIX = "dedup"
REQUIRED_COLUMNS = ("id", "text")
Progress = Callable[[float], None]  # fraction of the input parts done, 0..1


@dataclass
class SourceOutcome:
    """What packing one source did; ``reason`` says why a source produced no shard."""

    source: str
    documents_in: int = 0
    kept: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    repeated_copies: int = 0
    weights_clamped: int = 0
    text_bytes: int = 0
    stream_tokens: int = 0  # documents' tokens plus one EOD each, repeats included
    sequences: int = 0
    tail_tokens_dropped: int = 0
    reason: str = ""

    def reject(self, reason: str, count: int) -> None:
        if count:
            self.rejected[reason] = self.rejected.get(reason, 0) + count


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
    outcome = SourceOutcome(source)
    packer = Packer(config.seq_len + 1, spill.dtype)
    current = _Pass(1)
    while True:
        documents = _documents_of_pass(read_tables(current.number), current, config, outcome, quarantine)
        for table, encoded in encoder.map(documents, _texts):
            has_tokens = encoded.lengths > 0
            emitted = int(has_tokens.sum())
            if current.number == 1:
                outcome.kept += emitted
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
            outcome.reject("sampled_out_by_weight", int((counts == 0).sum()))
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


def prepare_tokenizer(
    repo: DataRepo, branch: str, input_commit: str, sources: list[str], config: ShardConfig
) -> tuple[str, dict[str, Any]]:
    """Train (or reuse) the tokenizer, store it on ``branch``; returns its JSON and a report."""
    if config.reuse_tokenizer_from:
        ref = config.reuse_tokenizer_from
        try:
            commit = repo.resolve(ref)
            tokenizer_json = repo.get(commit, TOKENIZER_PATH).decode()
        except NotFound as exc:
            raise TokenizerError(
                f"reuse_tokenizer_from={ref!r}: no {TOKENIZER_PATH} there ({exc}); name a dataset ref that has one"
            ) from exc
        info: dict[str, Any] = {"origin": "reused", "reused_from": ref, "reused_commit": commit}
    else:
        sample = TrainingSample(int(config.tokenizer_sample_mb * 1e6), config.tokenizer_sample_seed)
        for source in sources:
            for table in _read_source(repo, input_commit, source):
                sample.add(table)
        texts = sample.texts()
        if not texts:
            raise TokenizerError(f"no text to train a tokenizer on under {INPUT_PREFIX}/ at {input_commit}")
        tokenizer = train_tokenizer(texts, config.vocab_size, config.all_special_tokens)
        tokenizer_json = tokenizer.to_str()
        info = {
            "origin": "trained",
            "documents_seen": sample.documents_seen,
            "sample_documents": len(texts),
            "sample_bytes": sample.sample_bytes,
        }
    repo.put(branch, TOKENIZER_PATH, tokenizer_json.encode())
    return tokenizer_json, info | {"sha256": sha256_of_tokenizer(tokenizer_json)}


def _read_source(
    repo: DataRepo, ref: str, source: str, on_part: Callable[[], None] | None = None
) -> Iterator[pa.Table]:
    for path in list_parts(repo, ref, f"{INPUT_PREFIX}/{source}"):
        table = read_part(repo, ref, path)
        missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
        if missing:
            raise ValueError(f"{path} lacks column(s) {', '.join(missing)}; re-run the dedup stage")
        yield table
        if on_part is not None:
            on_part()


def run_shard_stage(
    repo: DataRepo,
    branch: str,
    config: ShardConfig,
    input_commit: str,
    flow_run_id: str | None = None,
    progress: Progress | None = None,
) -> StageResult:
    """The whole stage; raises ShardGateError (nothing committed) when the manifest fails its suite."""
    started = time.perf_counter()
    sources = list_sources(repo, input_commit, INPUT_PREFIX)
    if not sources:
        raise ValueError(
            f"no documents under {INPUT_PREFIX}/ at commit {input_commit}; run the dedup stage first"
        )
    for prefix in ("shards", "tokenizer", f"quarantine/{STAGE}"):
        clear_prefix(repo, branch, prefix)

    tokenizer_json, tokenizer_info = prepare_tokenizer(repo, branch, input_commit, sources, config)
    total_parts = sum(len(list_parts(repo, input_commit, f"{INPUT_PREFIX}/{s}")) for s in sources)
    parts_done = 0

    def part_done() -> None:
        nonlocal parts_done
        parts_done += 1
        if progress is not None:
            progress(min(parts_done / max(total_parts, 1), 1.0))

    report = StageReport(stage=STAGE)
    entries: list[ShardEntry] = []
    with (
        Encoder(tokenizer_json, config.eod_token, config.workers) as encoder,
        tempfile.TemporaryDirectory(prefix="tokenlake-shard-") as work,
    ):
        vocab_size = encoder.tokenizer.get_vocab_size(with_added_tokens=True)
        dtype = dtype_for_vocab(vocab_size)
        for source in sources:

            def read_tables(pass_number: int, source: str = source) -> Iterator[pa.Table]:
                return _read_source(repo, input_commit, source, part_done if pass_number == 1 else None)

            source_started = time.perf_counter()
            spill = RowSpill(Path(work) / f"{source}.rows", config.seq_len + 1, dtype)
            try:
                with PartWriter(repo, branch, f"quarantine/{STAGE}/{source}") as quarantine:
                    try:
                        outcome = pack_source(source, read_tables, encoder, config, spill, quarantine.write)
                    except BaseException:
                        spill.discard()
                        raise
                entries += _store_shards(repo, branch, source, spill, Path(work), encoder.eod_id, config)
            except OSError as exc:  # the local spill and shard files (the repository says its own)
                if not is_disk_full(exc):
                    raise
                needed = spill.rows * spill.row_len * spill.dtype.itemsize  # the shards copy the spill
                raise DiskFull(disk_full_message(f"the shards of source {source!r} to", work, needed)) from None
            _account(report, outcome, entries, time.perf_counter() - source_started)

        manifest = Manifest.build(
            entries,
            seq_len=config.seq_len,
            dtype=dtype.name,
            vocab_size=vocab_size,
            eod_token=encoder.eod_id,
            tokenizer_sha256=tokenizer_info["sha256"],
            input_commit=input_commit,
        )
    report.tokens = manifest.totals["tokens"]
    report.expectations = gate_manifest(manifest)  # raises ShardGateError on failure
    repo.put(branch, "shards/manifest.json", manifest.to_json().encode())
    report.seconds = round(time.perf_counter() - started, 3)
    text_bytes = sum(s["text_bytes"] for s in report.per_source.values())
    report.extra = {
        "tokenizer": tokenizer_info | {"vocab_size": vocab_size},
        "manifest_sha256": manifest.sha256(),
        "seq_len": config.seq_len,
        "dtype": dtype.name,
        "sequences": manifest.totals["sequences"],
        "shards": len(manifest.shards),
        "text_megabytes": round(text_bytes / 1e6, 3),
        "megabytes_per_second": round(text_bytes / 1e6 / max(report.seconds, 1e-9), 3),
        "sources_without_shards": {s: v["reason"] for s, v in report.per_source.items() if v["reason"]},
    }
    metadata = {
        "tokenizer_sha256": tokenizer_info["sha256"],
        "tokenizer_origin": tokenizer_info["origin"],
        "manifest_sha256": manifest.sha256(),
    }
    commit_id = commit_stage(
        repo, branch, report, config_hash(config), input_commit, flow_run_id, metadata=metadata
    )
    return StageResult(stage=STAGE, commit_id=commit_id, report=report.to_dict())


def _store_shards(
    repo: DataRepo, branch: str, source: str, spill: RowSpill, work: Path, eod: int, config: ShardConfig
) -> list[ShardEntry]:
    out_dir = work / source
    out_dir.mkdir()
    entries = []
    for shard in spill.write_shards(out_dir, eod, config.max_sequences_per_shard):
        name = f"shards/{source}/{shard.path.name}"
        repo.put(branch, name, str(shard.path))
        shard.path.unlink()
        entries.append(
            ShardEntry(
                name=name,
                source=source,
                sha256=shard.sha256,
                sequences=shard.sequences,
                tokens=shard.sequences * (config.seq_len + 1),
                bytes=shard.bytes,
                documents=shard.documents,
            )
        )
    return entries


def _account(report: StageReport, outcome: SourceOutcome, entries: list[ShardEntry], seconds: float) -> None:
    report.documents_in += outcome.documents_in
    report.kept += outcome.kept
    for reason, count in outcome.rejected.items():
        report.reject(reason, count)
    report.per_source[outcome.source] = {
        "documents_in": outcome.documents_in,
        "kept": outcome.kept,
        "rejected": dict(outcome.rejected),
        "repeated_copies": outcome.repeated_copies,
        "weights_clamped": outcome.weights_clamped,
        "text_bytes": outcome.text_bytes,
        "stream_tokens": outcome.stream_tokens,
        "sequences": outcome.sequences,
        "stored_tokens": sum(e.tokens for e in entries if e.source == outcome.source),
        "shards": sum(1 for e in entries if e.source == outcome.source),
        "tail_tokens_dropped": outcome.tail_tokens_dropped,
        "reason": outcome.reason,
        "seconds": round(seconds, 3),
    }
