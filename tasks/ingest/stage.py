"""The ingest stage: every configured source into ``raw/<source>/`` and
``quarantine/ingest/<source>/``, gated by ``expectations/raw_documents.json`` and
``expectations/stage_stats.json``."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from formats import layout
from tasks.gates import DocumentSample
from tasks.ingest.config import IngestConfig, SourceConfig
from tasks.ingest.documents import STAGE, ingest_partition
from tasks.ingest.partitions import Partition, describe, plan_partitions
from tasks.partition_map import partitions
from tasks.schema import DOCUMENT_SCHEMA
from tasks.stage import ConfigError, PartitionOutput, StageReport, StageWriter, write_partition
from versioning import DataRepo

GATE_COLUMNS = ["id", "source", "text", "locator", "meta"]
GATE_SCHEMA = pa.schema([*DOCUMENT_SCHEMA, pa.field("text_chars", pa.int64())])


@dataclass(frozen=True)
class IngestWork:
    """One partition of one source, as a worker gets it."""

    repo: DataRepo
    branch: str
    source: SourceConfig
    partition: Partition
    config: IngestConfig


def ingest_one(work: IngestWork) -> PartitionOutput:
    """A partition into ``raw/<source>/part-<partition>.parquet`` and its quarantine part."""
    kept, quarantined = ingest_partition(work.source, work.partition, work.config)
    return write_partition(
        work.repo,
        work.branch,
        STAGE,
        layout.RAW,
        work.source.name,
        layout.part_name(work.partition.index),
        kept,
        quarantined,
        work.config.gate.max_rows if work.config.gate.enabled else 0,
        GATE_COLUMNS,
    )


def run_ingest(repo: DataRepo, branch: str, input_commit: str, config: IngestConfig) -> StageReport:
    """Ingest every source onto ``branch``; raises ConfigError before any work,
    ExpectationsFailed (nothing committed) when the output breaks its expectations.

    Each partition is one unit of :func:`tasks.partition_map.partitions` and writes its own
    part, named after the partition, so ``raw/`` holds one part per partition that kept documents.
    """
    if not config.sources:
        raise ConfigError("ingest has no sources; add at least one entry to 'sources'")
    plans = {source.name: plan_partitions(source, config) for source in config.sources}  # fails fast

    sample = DocumentSample(config.gate.max_rows if config.gate.enabled else 0, GATE_COLUMNS)
    stage = StageWriter(repo, branch, STAGE, documents=layout.RAW, sample=sample)
    work = [IngestWork(repo, branch, s, p, config) for s in config.sources for p in plans[s.name]]
    outputs = list(
        partitions().map(
            "ingest-partition",
            ingest_one,
            work,
            retries=config.partition_retries,
            describe=lambda w: describe(w.partition),
        )
    )
    for source in config.sources:
        with stage.source(source.name) as out:
            for output in outputs:
                if output.source == source.name:
                    out.absorb(output)
            out.facts |= {
                "kind": source.kind,
                "reference": source.reference,
                "format": source.format,
                "partitions": len(plans[source.name]),
            }

    documents = {
        "sources": [s.name for s in config.sources],
        "max_text_chars": max(s.max_chars for s in config.sources),
    }
    by_reason = {name: counts["rejected"] for name, counts in stage.report.per_source.items()}
    stage.gate_documents(
        input_commit,
        config.gate,
        "raw_documents",
        GATE_SCHEMA,
        documents,
        by_reason,
        lambda _reason: (0.0, config.gate.max_quarantine_rate),
    )
    report = stage.finish()
    # lineage shows a checkpoint's source sections from here
    report.extra["sources"] = [s.model_dump(mode="json") for s in config.sources]
    return report
