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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from formats import layout
from formats.shards import HEADER_SIZE, Manifest, ShardEntry, dtype_for_vocab
from tasks.gates import Coverage, GateCheck
from tasks.partition_map import partitions
from tasks.parts import PartWriter, list_parts, list_sources, read_part
from tasks.shard.config import ShardConfig
from tasks.shard.pack import STAGE, RowSpill, SourceOutcome, pack_source
from tasks.stage import PartitionOutput, StageReport, StageWriter
from tasks.tokenize import Encoder, TokenizerError, TrainingSample, load_tokenizer, train_tokenizer
from tasks.tokenize import tokenizer_sha256 as sha256_of_tokenizer
from versioning import DataRepo, DiskFull, NotFound
from versioning.diskspace import disk_full_message, is_disk_full

INPUT_PREFIX = layout.SAFE
REQUIRED_COLUMNS = ("id", "text")
Progress = Callable[[float], None]  # fraction of the sources done, 0..1
MANIFEST_ROWS = pa.schema(
    [(column, pa.string()) for column in ("name", "source", "sha256", "dtype", "dtype_for_vocabulary")]
    + [
        (column, pa.int64())
        for column in (
            "sequences",
            "tokens",
            "bytes",
            "sequences_times_row_length",
            "header_plus_token_bytes",
            "sequences_above_source_minimum",
            "source_declared_sequences",
            "source_summed_sequences",
            "source_declared_tokens",
            "source_summed_tokens",
            "vocab_size",
            "eod_token",
        )
    ]
)


def prepare_tokenizer(
    repo: DataRepo, branch: str, input_commit: str, sources: list[str], config: ShardConfig
) -> tuple[str, dict[str, Any]]:
    """Train (or reuse) the tokenizer, store it on ``branch``; returns its JSON and a report."""
    if config.reuse_tokenizer_from:
        ref = config.reuse_tokenizer_from
        try:
            commit = repo.resolve(ref)
            tokenizer_json = repo.get(commit, layout.TOKENIZER).decode()
        except NotFound as exc:
            raise TokenizerError(
                f"reuse_tokenizer_from={ref!r}: no {layout.TOKENIZER} there ({exc}); name a dataset ref that has one"
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
    repo.put(branch, layout.TOKENIZER, tokenizer_json.encode())
    return tokenizer_json, info | {"sha256": sha256_of_tokenizer(tokenizer_json)}


def _read_source(repo: DataRepo, ref: str, source: str) -> Iterator[pa.Table]:
    for path in list_parts(repo, ref, layout.source_folder(INPUT_PREFIX, source)):
        table = read_part(repo, ref, path)
        missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
        if missing:
            raise ValueError(f"{path} lacks column(s) {', '.join(missing)}; re-run the dedup stage")
        yield table


@dataclass(frozen=True)
class ShardWork:
    """One source, as a worker gets it: its documents at the input commit and the tokenizer."""

    repo: DataRepo
    branch: str
    input_commit: str
    source: str
    tokenizer_json: str
    config: ShardConfig


def shard_one(work: ShardWork) -> PartitionOutput:
    """One source's documents packed into ``shards/<source>/shard-NNNNN.bin`` and its quarantine
    parts; the report carries the shard entries and the source's facts."""
    repo, config, source = work.repo, work.config, work.source
    started = time.perf_counter()
    quarantine = PartWriter(repo, work.branch, layout.quarantine_folder(STAGE, source))
    with (
        Encoder(work.tokenizer_json, config.eod_token, config.workers, config.encoder) as encoder,
        tempfile.TemporaryDirectory(prefix="tokenlake-shard-") as scratch,
    ):
        dtype = dtype_for_vocab(encoder.tokenizer.get_vocab_size(with_added_tokens=True))
        spill = RowSpill(Path(scratch) / f"{source}.rows", config.seq_len + 1, dtype)

        def read_tables(pass_number: int) -> Iterator[pa.Table]:
            return _read_source(repo, work.input_commit, source)

        try:
            try:
                outcome = pack_source(source, read_tables, encoder, config, spill, quarantine.write)
            except BaseException:
                spill.discard()
                raise
            stored = _store_shards(repo, work.branch, source, spill, Path(scratch), encoder.eod_id, config)
        except OSError as exc:  # the local spill and shard files (the repository says its own)
            if not is_disk_full(exc):
                raise
            needed = spill.rows * spill.row_len * spill.dtype.itemsize  # the shards copy the spill
            raise DiskFull(
                disk_full_message(f"the shards of source {source!r} to", scratch, needed)
            ) from None
    quarantine.close()
    # kept documents became tokens; sampled-out ones were only counted, the others quarantined
    output = PartitionOutput(outcome.documents_in, outcome.kept, dict(outcome.rejected), source=source)
    output.facts = _facts(outcome, stored, time.perf_counter() - started) | {
        "entries": stored,
        "encoder": encoder.batch_encoder.name,
        "tiktoken_cannot": encoder.batch_encoder.unreproducible,
    }
    return output


def run_shard(
    repo: DataRepo, branch: str, input_commit: str, config: ShardConfig, progress: Progress | None = None
) -> StageReport:
    """The whole stage; raises ExpectationsFailed (nothing committed) when the manifest fails its suite."""
    sources = list_sources(repo, input_commit, INPUT_PREFIX)
    if not sources:
        raise ValueError(
            f"no documents under {INPUT_PREFIX}/ at commit {input_commit}; run the safety stage first"
        )
    stage = StageWriter(repo, branch, STAGE, clear=[layout.SHARDS, layout.TOKENIZER_FOLDER])
    tokenizer_json, tokenizer_info = prepare_tokenizer(repo, branch, input_commit, sources, config)
    tokenizer, eod_id = load_tokenizer(tokenizer_json, config.eod_token)  # a missing EOD fails here, once
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    dtype = dtype_for_vocab(vocab_size)
    work = [ShardWork(repo, branch, input_commit, source, tokenizer_json, config) for source in sources]
    entries: list[ShardEntry] = []
    for done, output in enumerate(partitions().map("shard-source", shard_one, work), start=1):
        entries += output.facts.pop("entries")
        with stage.source(output.source) as out:
            out.absorb(output)
            out.facts |= output.facts
        if progress is not None:
            progress(done / len(sources))

    manifest = Manifest.build(
        entries,
        seq_len=config.seq_len,
        dtype=dtype.name,
        vocab_size=vocab_size,
        eod_token=eod_id,
        tokenizer_sha256=tokenizer_info["sha256"],
        input_commit=input_commit,
    )
    stage.report.tokens = manifest.totals["tokens"]
    stage.gate(input_commit, [manifest_check(manifest)], Coverage.everything(len(manifest.shards), "shards"))
    repo.put(branch, layout.MANIFEST, manifest.to_json().encode())
    report = stage.finish()
    text_bytes = sum(s["text_bytes"] for s in report.per_source.values())
    report.extra |= {
        "tokenizer": tokenizer_info | {"vocab_size": vocab_size},
        "manifest_sha256": manifest.sha256(),
        "seq_len": config.seq_len,
        "dtype": dtype.name,
        "sequences": manifest.totals["sequences"],
        # documents ending in a stored sequence (as `shards verify` counts); a source's tokens
        # after its last whole sequence are not stored, so this is at most the documents kept
        "documents_in_shards": sum(e.documents for e in manifest.shards),
        "shards": len(manifest.shards),
        "text_megabytes": round(text_bytes / 1e6, 3),
        "megabytes_per_second": round(text_bytes / 1e6 / max(report.seconds, 1e-9), 3),
        "encoder": config.encoder,
        "encoder_used": sorted({s["encoder"] for s in report.per_source.values()}),
        # why tiktoken cannot give this tokenizer's ids, when it cannot (then tokenizers encodes)
        "tiktoken_cannot": next(
            (s["tiktoken_cannot"] for s in report.per_source.values() if s["tiktoken_cannot"]), None
        ),
        # documents the tiktoken encoder left to tokenizers (see tasks/tiktoken_bpe.py)
        "encoder_fallbacks": sum(s["encoder_fallbacks"] for s in report.per_source.values()),
        "sources_without_shards": {s: v["reason"] for s, v in report.per_source.items() if v["reason"]},
    }
    report.note = (
        f"{manifest.totals['sequences']} sequences in {len(manifest.shards)} shards, "
        f"{report.extra['megabytes_per_second']:.1f} MB/s, tokenizer {tokenizer_info['sha256'][:12]}"
    )
    report.commit_metadata |= {
        "tokenizer_sha256": tokenizer_info["sha256"],
        "tokenizer_origin": tokenizer_info["origin"],
        "manifest_sha256": manifest.sha256(),
    }
    return report


def manifest_check(manifest: Manifest) -> GateCheck:
    """``expectations/shard_manifest.json`` over the manifest: one row per shard, with the
    per-source and total sums the suite compares (declared in the manifest vs summed) and the
    manifest's own fields; the suite checks :data:`formats.shards.MANIFEST_INVARIANTS`."""
    row_len = manifest.seq_len + 1
    itemsize = manifest.numpy_dtype.itemsize
    summed: dict[str, dict[str, int]] = {}
    minimum: dict[str, int] = {}
    for e in manifest.shards:
        sums = summed.setdefault(e.source, {"sequences": 0, "tokens": 0})
        sums["sequences"] += e.sequences
        sums["tokens"] += e.tokens
        minimum[e.source] = min(minimum.get(e.source, e.sequences), e.sequences)
    rows = []
    for e in manifest.shards:
        declared = manifest.sources.get(e.source, {"sequences": -1, "tokens": -1})
        rows.append(
            {
                "name": e.name,
                "source": e.source,
                "sha256": e.sha256,
                "sequences": e.sequences,
                "tokens": e.tokens,
                "bytes": e.bytes,
                "sequences_times_row_length": e.sequences * row_len,
                "header_plus_token_bytes": HEADER_SIZE + e.tokens * itemsize,
                "sequences_above_source_minimum": e.sequences - minimum[e.source],
                "source_declared_sequences": declared["sequences"],
                "source_summed_sequences": summed[e.source]["sequences"],
                "source_declared_tokens": declared["tokens"],
                "source_summed_tokens": summed[e.source]["tokens"],
                "dtype": manifest.dtype,
                "dtype_for_vocabulary": dtype_for_vocab(manifest.vocab_size).name,
                "vocab_size": manifest.vocab_size,
                "eod_token": manifest.eod_token,
            }
        )
    parameters = {
        "declared_total_sequences": manifest.totals["sequences"],
        "declared_total_tokens": manifest.totals["tokens"],
        "declared_sources": sorted(manifest.sources),
    }
    return GateCheck("shard_manifest", pa.Table.from_pylist(rows, schema=MANIFEST_ROWS), parameters, ["name"])


def _store_shards(
    repo: DataRepo, branch: str, source: str, spill: RowSpill, work: Path, eod: int, config: ShardConfig
) -> list[ShardEntry]:
    out_dir = work / source
    out_dir.mkdir()
    entries = []
    for index, shard in enumerate(spill.write_shards(out_dir, eod, config.max_sequences_per_shard)):
        name = layout.shard_path(source, index)
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


def _facts(outcome: SourceOutcome, stored: list[ShardEntry], seconds: float) -> dict[str, object]:
    """A source's report entry besides its counts: what packing did and the shards it stored."""
    return {
        "repeated_copies": outcome.repeated_copies,
        "weights_clamped": outcome.weights_clamped,
        "text_bytes": outcome.text_bytes,
        "stream_tokens": outcome.stream_tokens,
        "sequences": outcome.sequences,
        "stored_tokens": sum(e.tokens for e in stored),
        "documents_in_shards": sum(e.documents for e in stored),  # those ending in a stored sequence
        "shards": len(stored),
        "tail_tokens_dropped": outcome.tail_tokens_dropped,
        "encoder_fallbacks": outcome.encoder_fallbacks,
        "reason": outcome.reason,
        "seconds": round(seconds, 3),
    }
