"""The ingest stage: every configured source into ``raw/<source>/`` and
``quarantine/ingest/<source>/``, gated by ``expectations/raw_documents.json`` and
``expectations/stage_stats.json``, committed as one commit."""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa

from formats import layout
from tasks.gates import (
    DocumentSample,
    GateCheck,
    gate_stage,
    stats_rows,
    stats_table,
)
from tasks.ingest.config import IngestConfig
from tasks.ingest.documents import STAGE
from tasks.ingest.partitions import plan_partitions
from tasks.ingest.runner import run_partitions
from tasks.parts import PartWriter, clear_prefix
from tasks.schema import DOCUMENT_SCHEMA
from tasks.stage import ConfigError, StageReport, StageResult, Stopwatch, commit_stage, config_hash
from versioning import DataRepo

log = logging.getLogger(__name__)
GATE_COLUMNS = ["id", "source", "text", "locator", "meta"]
GATE_SCHEMA = pa.schema([*DOCUMENT_SCHEMA, pa.field("text_chars", pa.int64())])


def run_ingest(
    repo: DataRepo, branch: str, config: IngestConfig, input_commit: str, flow_run_id: str | None = None
) -> StageResult:
    """Ingest every source onto ``branch`` and commit; raises ConfigError before any work,
    ExpectationsFailed (nothing committed) when the output breaks its expectations."""
    if not config.sources:
        raise ConfigError("ingest has no sources; add at least one entry to 'sources'")
    plans = {source.name: plan_partitions(source, config) for source in config.sources}  # fails fast

    with Stopwatch() as clock:
        for prefix in (layout.RAW, layout.quarantine_folder(STAGE), layout.data_docs_folder(STAGE)):
            clear_prefix(repo, branch, prefix)
        report = StageReport(stage=STAGE)
        sample = DocumentSample(config.gate.max_rows if config.gate.enabled else 0, GATE_COLUMNS)
        stats: list[dict[str, Any]] = []
        for source in config.sources:
            counts = {"documents_in": 0, "kept": 0, "rejected": {}}
            with (
                PartWriter(repo, branch, layout.source_folder(layout.RAW, source.name), config.rows_per_part) as kept_writer,
                PartWriter(
                    repo, branch, layout.quarantine_folder(STAGE, source.name), config.rows_per_part
                ) as quarantine_writer,
            ):
                for _, kept, quarantined in run_partitions(source, plans[source.name], config):
                    kept_writer.write(kept)
                    quarantine_writer.write(quarantined)
                    sample.add(kept)
                    counts["kept"] += kept.num_rows
                    counts["documents_in"] += kept.num_rows + quarantined.num_rows
                    for reason in quarantined.column("reason").to_pylist():
                        counts["rejected"][reason] = counts["rejected"].get(reason, 0) + 1
            report.documents_in += counts["documents_in"]
            report.kept += counts["kept"]
            for reason, n in counts["rejected"].items():
                report.reject(reason, n)
            report.per_source[source.name] = {
                "kind": source.kind,
                "reference": source.reference,
                "format": source.format,
                "partitions": len(plans[source.name]),
                "raw_parts": len(kept_writer.paths),
                **counts,
            }
            stats += stats_rows(
                source.name,
                counts["documents_in"],
                counts["kept"],
                counts["rejected"],
                lambda _rule: (0.0, config.gate.max_quarantine_rate),
            )
            log.info(
                "ingest %s: %d in, %d kept, rejected %s",
                source.name,
                counts["documents_in"],
                counts["kept"],
                counts["rejected"],
            )

        if config.gate.enabled:
            checks = [
                GateCheck(
                    "raw_documents",
                    sample.table(GATE_SCHEMA),
                    {
                        "sources": [s.name for s in config.sources],
                        "max_text_chars": max(s.max_chars for s in config.sources),
                    },
                    ["locator"],
                ),
                GateCheck("stage_stats", stats_table(stats), {}, ["source", "rule"]),
            ]
            gate_stage(repo, branch, report, input_commit, checks, sample.coverage())
        else:
            report.commit_metadata["gate"] = "disabled"
    report.seconds = clock.seconds
    # lineage shows a checkpoint's source sections from here
    report.extra["sources"] = [s.model_dump(mode="json") for s in config.sources]
    commit_id = commit_stage(repo, branch, report, config_hash(config), input_commit, flow_run_id)
    return StageResult(stage=STAGE, commit_id=commit_id, report=report.to_dict())
