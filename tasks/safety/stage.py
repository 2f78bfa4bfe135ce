"""The safety stage: ``dedup/`` at the input commit through the safety checks into
``safe/<source>/`` and ``quarantine/safety/<source>/``.

It sits between dedup and shard, so a new benchmark set, blocklist or PII policy re-runs
safety -> shard -> mix only, with ingest, validate and dedup reused from the stage cache. The
files it checked against are committed with its output: each benchmark under
``eval_sets/<name>/`` (the file as given, and ``spec.json``: fields, n-gram size, counts,
sha256) and each list as ``blocklists/<name>.txt``, so a version records what it was
decontaminated and filtered against. With nothing configured, parts are copied unchanged.
"""

from __future__ import annotations

import io
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from formats import layout
from tasks.partition_map import partitions
from tasks.parts import iter_batches, list_parts, list_sources, put_json, read_part
from tasks.safety.blocklist import Blocklist
from tasks.safety.config import SafetyConfig
from tasks.safety.decontaminate import BenchmarkSet, read_items
from tasks.safety.screen import STAGE, SafetyChecks, SafetyStats, apply_safety
from tasks.stage import ConfigError, PartitionOutput, StageReport, StageWriter, write_partition
from versioning import DataRepo

INPUT_PREFIX = layout.DEDUP


class SafetyConfigError(ConfigError):
    """A safety misconfiguration found before any work; the message names what to fix."""


def check_files(config: SafetyConfig) -> None:
    """Every benchmark and blocklist file exists and has the named fields (one sentence if not)."""
    for benchmark in config.decontamination.benchmarks:
        read_items(benchmark)
    for listed in config.blocklist.lists:
        if not Path(listed.path).is_file():
            raise SafetyConfigError(f"blocklist {listed.name!r}: file {listed.path} does not exist")


def build_checks(config: SafetyConfig) -> SafetyChecks:
    benchmarks = BenchmarkSet.build(config.decontamination) if config.decontamination.benchmarks else None
    blocklist = Blocklist.load(config.blocklist) if config.blocklist.lists else None
    return SafetyChecks(config, benchmarks, blocklist)


def record_inputs(repo: DataRepo, branch: str, config: SafetyConfig, checks: SafetyChecks) -> None:
    """Commit the benchmark files and blocklists with the stage's output."""
    for benchmark in config.decontamination.benchmarks:
        path = Path(benchmark.path)
        folder = layout.eval_set_folder(benchmark.name)
        repo.put(branch, f"{folder}/{path.name}", str(path))
        assert checks.benchmarks is not None
        spec = benchmark.model_dump() | {"ngram": config.decontamination.ngram}
        put_json(repo, branch, f"{folder}/spec.json", spec | checks.benchmarks.facts[benchmark.name])
    for listed in config.blocklist.lists:
        repo.put(branch, layout.blocklist_path(listed.name), listed.path)


@dataclass(frozen=True)
class SafetyWork:
    """One dedup part of one source, as a worker gets it."""

    repo: DataRepo
    branch: str
    input_commit: str
    source: str
    path: str  # dedup/<source>/part-NNNNN.parquet
    checks: SafetyChecks


def safety_one(work: SafetyWork) -> PartitionOutput:
    """One dedup part through the checks into ``safe/<source>/`` under the same part name."""
    name = work.path.rsplit("/", 1)[1]
    if not work.checks.config.checks_anything:  # copied byte for byte: same documents, same object
        with work.repo.open(work.input_commit, work.path) as f:
            data = f.read()
        rows = pq.ParquetFile(pa.BufferReader(data)).metadata.num_rows
        target = f"{layout.source_folder(layout.SAFE, work.source)}/{name}"
        work.repo.put(work.branch, target, io.BytesIO(data))
        output = PartitionOutput(source=work.source, documents_in=rows, kept=rows)
        output.parts.append(target)
        output.facts = SafetyStats().to_dict()
        return output
    table = read_part(work.repo, work.input_commit, work.path)
    kept, quarantined, totals = [], [], SafetyStats()
    for batch in iter_batches([table], work.checks.config.batch_rows):
        k, q, stats = apply_safety(batch, work.checks)
        kept.append(k)
        quarantined.append(q)
        totals.add(stats)
    empty = pa.table({"reason": pa.array([], pa.string())})
    output = write_partition(
        work.repo,
        work.branch,
        STAGE,
        layout.SAFE,
        work.source,
        name,
        pa.concat_tables(kept) if kept else table.slice(0, 0),
        pa.concat_tables(quarantined) if quarantined else empty,
    )
    output.facts = totals.to_dict()
    return output


def run_safety(repo: DataRepo, branch: str, input_commit: str, config: SafetyConfig) -> StageReport:
    """Check every deduplicated source onto ``branch``; SafetyConfigError before any work."""
    sources = list_sources(repo, input_commit, INPUT_PREFIX)
    if not sources:
        raise SafetyConfigError(
            f"no documents under {INPUT_PREFIX}/ at commit {input_commit}; run the dedup stage first"
        )
    check_files(config)
    started = time.perf_counter()
    checks = build_checks(config)
    built = round(time.perf_counter() - started, 3)
    stage = StageWriter(
        repo, branch, STAGE, documents=layout.SAFE, clear=[layout.EVAL_SETS, layout.BLOCKLISTS]
    )
    record_inputs(repo, branch, config, checks)
    work = [
        SafetyWork(repo, branch, input_commit, source, path, checks)
        for source in sources
        for path in list_parts(repo, input_commit, layout.source_folder(INPUT_PREFIX, source))
    ]
    outputs = list(
        partitions().map(
            "safety-part", safety_one, work, describe=lambda w: f"{w.path} at {input_commit[:12]}"
        )
    )
    total = SafetyStats()
    for source in sources:
        stats = SafetyStats()
        with stage.source(source) as out:
            for output in outputs:
                if output.source == source:
                    out.absorb(output)
                    stats.add(SafetyStats.from_dict(output.facts))
            out.facts |= stats.to_dict()
        total.add(stats)
    report = stage.finish()
    report.extra["safety"] = total.to_dict()
    if checks.benchmarks is not None:
        report.extra["benchmarks"] = {
            "ngram": checks.benchmarks.n,
            "mode": config.decontamination.mode,
            "distinct_ngrams": checks.benchmarks.ngrams,
            "memory_bytes": checks.benchmarks.nbytes,
            "build_seconds": built,
            "sets": checks.benchmarks.facts,
        }
    if checks.blocklist is not None:
        report.extra["blocklists"] = checks.blocklist.facts
    report.extra["pii_modes"] = config.pii.active()
    report.commit_metadata["eval_sets"] = ",".join(b.name for b in config.decontamination.benchmarks)
    report.commit_metadata["blocklists"] = ",".join(b.name for b in config.blocklist.lists)
    report.commit_metadata["gate"] = "none"
    report.note = _note(config, total)
    return report


def _note(config: SafetyConfig, total: SafetyStats) -> str:
    if not config.checks_anything:
        return "no safety checks configured; documents copied"
    counts = Counter(
        {"contaminated": sum(total.contaminated.values()), "blocked": sum(total.blocked.values())}
    )
    counts["redacted"] = total.redacted_documents
    return ", ".join(f"{k} {v}" for k, v in counts.items())
