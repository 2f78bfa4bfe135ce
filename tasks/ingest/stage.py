"""The ingest stage: every configured source into ``raw/<source>/`` and
``quarantine/ingest/<source>/``, gated by ``expectations/raw_documents.json`` and
``expectations/stage_stats.json``."""

from __future__ import annotations

import pyarrow as pa

from formats import layout
from tasks.gates import DocumentSample
from tasks.ingest.config import IngestConfig
from tasks.ingest.documents import STAGE
from tasks.ingest.partitions import plan_partitions
from tasks.ingest.runner import run_partitions
from tasks.schema import DOCUMENT_SCHEMA
from tasks.stage import ConfigError, StageReport, StageWriter
from versioning import DataRepo

GATE_COLUMNS = ["id", "source", "text", "locator", "meta"]
GATE_SCHEMA = pa.schema([*DOCUMENT_SCHEMA, pa.field("text_chars", pa.int64())])


def run_ingest(repo: DataRepo, branch: str, input_commit: str, config: IngestConfig) -> StageReport:
    """Ingest every source onto ``branch``; raises ConfigError before any work,
    ExpectationsFailed (nothing committed) when the output breaks its expectations."""
    if not config.sources:
        raise ConfigError("ingest has no sources; add at least one entry to 'sources'")
    plans = {source.name: plan_partitions(source, config) for source in config.sources}  # fails fast

    sample = DocumentSample(config.gate.max_rows if config.gate.enabled else 0, GATE_COLUMNS)
    stage = StageWriter(
        repo, branch, STAGE, documents=layout.RAW, rows_per_part=config.rows_per_part, sample=sample
    )
    for source in config.sources:
        with stage.source(source.name) as out:
            for _, kept, quarantined in run_partitions(source, plans[source.name], config):
                out.write(kept, quarantined)
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
