"""The dedup stage over the repository: ``filtered/`` at the input commit -> ``dedup/``,
``quarantine/dedup/``, a new run of ``index/minhash/`` and ``reports/dedup.json``, one commit.

Deduplication is global: a document of one source can duplicate a document of another, and
new documents are compared with every published one (see :mod:`tasks.dedup.index`). The
input is read twice, part by part in the same order: once to plan, once to write.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from formats import layout
from tasks.dedup.config import DedupConfig
from tasks.dedup.index import load_published, next_run_folder, write_index_run
from tasks.dedup.plan import STAGE, apply_plan, plan_dedup
from tasks.parts import PartWriter, clear_prefix, list_parts, list_sources, read_part
from tasks.stage import StageReport, StageResult, commit_stage, config_hash
from versioning import DataRepo

INPUT_PREFIX = layout.FILTERED
OUTPUT_PREFIX = layout.DEDUP


def run_dedup_stage(
    repo: DataRepo, branch: str, config: DedupConfig, input_commit: str, flow_run_id: str | None = None
) -> StageResult:
    started = time.perf_counter()
    sources = list_sources(repo, input_commit, INPUT_PREFIX)
    if not sources:
        raise ValueError(
            f"no documents under {INPUT_PREFIX}/ at commit {input_commit}; run the validate stage first"
        )
    parts = [(s, path) for s in sources for path in list_parts(repo, input_commit, layout.source_folder(INPUT_PREFIX, s))]
    published = load_published(repo, input_commit, config)
    index_run = next_run_folder(repo, input_commit, config)

    plan = plan_dedup((read_part(repo, input_commit, path) for _, path in parts), config, published)

    for prefix in (OUTPUT_PREFIX, layout.quarantine_folder(STAGE), index_run):
        clear_prefix(repo, branch, prefix)
    report = StageReport(stage=STAGE)
    start = 0
    for source in sources:
        counts: dict[str, Any] = {"documents_in": 0, "kept": 0, "rejected": {}}
        with (
            PartWriter(repo, branch, layout.source_folder(OUTPUT_PREFIX, source)) as kept_writer,
            PartWriter(repo, branch, layout.quarantine_folder(STAGE, source)) as quarantine_writer,
        ):
            for _, path in (p for p in parts if p[0] == source):
                table = read_part(repo, input_commit, path)
                kept, quarantined = apply_plan(table, plan, start)
                start += table.num_rows
                kept_writer.write(kept)
                quarantine_writer.write(quarantined)
                counts["documents_in"] += table.num_rows
                counts["kept"] += kept.num_rows
                for reason, n in _count(quarantined.column("reason").to_pylist()).items():
                    counts["rejected"][reason] = counts["rejected"].get(reason, 0) + n
        report.per_source[source] = counts
        report.documents_in += counts["documents_in"]
        report.kept += counts["kept"]
        for reason, n in counts["rejected"].items():
            report.reject(reason, n)

    index_parts = write_index_run(repo, branch, index_run, plan.index_entries, config, input_commit)
    report.seconds = round(time.perf_counter() - started, 3)
    text_megabytes = plan.stats["shingled_megabytes"]
    report.extra = plan.stats | {
        "mode": config.mode,
        "threshold": config.threshold,
        "index_run": index_run,
        "index_entries_written": plan.index_entries.num_rows,
        "index_parts": len(index_parts),
        "weight_total": float(np.sum(plan.weight[~plan.removed])) if len(plan.weight) else 0.0,
        "shingled_megabytes_per_second": round(text_megabytes / max(report.seconds, 1e-9), 3),
    }
    metadata = {"dedup_mode": config.mode, "index_run": index_run}
    commit_id = commit_stage(repo, branch, report, config_hash(config), input_commit, flow_run_id, metadata)
    return StageResult(stage=STAGE, commit_id=commit_id, report=report.to_dict())


def _count(values: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts
