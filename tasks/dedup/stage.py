"""The dedup stage over the repository: ``filtered/`` at the input commit -> ``dedup/``,
``quarantine/dedup/``, a new run of ``index/minhash/`` and ``reports/dedup.json``.

Deduplication is global: a document of one source can duplicate a document of another, and
new documents are compared with every published one (see :mod:`tasks.dedup.index`). The
input is read twice, part by part in the same order: once to plan, once to write.
"""

from __future__ import annotations

import numpy as np

from formats import layout
from tasks.dedup.config import DedupConfig
from tasks.dedup.index import load_published, next_run_folder, write_index_run
from tasks.dedup.plan import STAGE, apply_plan, plan_dedup
from tasks.parts import list_parts, list_sources, read_part
from tasks.stage import StageReport, StageWriter
from versioning import DataRepo

INPUT_PREFIX = layout.FILTERED


def run_dedup(repo: DataRepo, branch: str, input_commit: str, config: DedupConfig) -> StageReport:
    sources = list_sources(repo, input_commit, INPUT_PREFIX)
    if not sources:
        raise ValueError(
            f"no documents under {INPUT_PREFIX}/ at commit {input_commit}; run the validate stage first"
        )
    index_run = next_run_folder(repo, input_commit, config)
    stage = StageWriter(repo, branch, STAGE, documents=layout.DEDUP, clear=[index_run])
    parts = {s: list_parts(repo, input_commit, layout.source_folder(INPUT_PREFIX, s)) for s in sources}
    published = load_published(repo, input_commit, config)
    tables = (read_part(repo, input_commit, path) for paths in parts.values() for path in paths)
    plan = plan_dedup(tables, config, published)

    start = 0  # the plan addresses rows in the order it read them
    for source, paths in parts.items():
        with stage.source(source) as out:
            for path in paths:
                table = read_part(repo, input_commit, path)
                out.write(*apply_plan(table, plan, start))
                start += table.num_rows

    index_parts = write_index_run(repo, branch, index_run, plan.index_entries, config, input_commit)
    report = stage.finish()
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
    report.note = (
        f"{config.mode} mode, {plan.stats['contents_hashed']} contents hashed, "
        f"{plan.stats['published_in_input']} reused from {plan.stats['published_documents']} published"
    )
    report.commit_metadata |= {"dedup_mode": config.mode, "index_run": index_run}
    return report
