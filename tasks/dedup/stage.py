"""The dedup stage over the repository: ``filtered/`` at the input commit -> ``dedup/``,
``quarantine/dedup/``, a new run of ``index/minhash/`` and ``reports/dedup.json``.

Deduplication is global: a document of one source can duplicate a document of another, and
new documents are compared with every published one (see :mod:`tasks.dedup.index`). The plan
is computed as a shuffle over hash buckets (:mod:`tasks.dedup.shuffle`), every step a partition
map, so no process holds the corpus's signatures; its decisions equal the in-memory
:func:`tasks.dedup.plan.plan_dedup`'s. Each input part then becomes the output part of the
same name.
"""

from __future__ import annotations

from formats import layout
from tasks.dedup.config import DedupConfig
from tasks.dedup.index import next_run_folder, published_runs, write_run_meta
from tasks.dedup.plan import STAGE
from tasks.dedup.shuffle import Part, ShuffleRun, apply_step, plan_in_buckets
from tasks.partition_map import partitions
from tasks.parts import clear_prefix, list_parts, list_sources
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
    scratch = layout.scratch_folder(STAGE)
    stage = StageWriter(repo, branch, STAGE, documents=layout.DEDUP, clear=[index_run, scratch])
    run = ShuffleRun(
        repo,
        branch,
        input_commit,
        config,
        scratch,
        index_run,
        tuple(published_runs(repo, input_commit, config)),
    )
    paths = [
        (s, p) for s in sources for p in list_parts(repo, input_commit, layout.source_folder(INPUT_PREFIX, s))
    ]
    parts = [Part(run, index, path, source) for index, (source, path) in enumerate(paths)]
    shuffle = plan_in_buckets(run, parts)
    outputs = list(partitions().map("dedup-apply", apply_step, parts, describe=lambda p: p.path))
    for source in sources:
        with stage.source(source) as out:
            for output in outputs:
                if output.source == source:
                    out.absorb(output)
    numbers = shuffle.numbers
    write_run_meta(repo, branch, index_run, config, input_commit, numbers.get("index_entries_written", 0))
    clear_prefix(repo, branch, scratch)

    report = stage.finish()
    bands, rows = config.banding
    text_megabytes = round(numbers.get("shingled_bytes", 0) / 1e6, 3)
    report.extra = {
        "documents": report.documents_in,
        "published_documents": numbers.get("published_documents", 0),
        "published_in_input": numbers.get("published_in_input", 0),
        "contents": numbers.get("contents", 0),
        "contents_hashed": numbers.get("contents_hashed", 0),
        "band_keys_reused": numbers.get("band_keys_reused", 0),
        "shingled_megabytes": text_megabytes,
        "bands": bands,
        "rows": rows,
        "buckets": config.buckets,
        "bucket_slices": numbers.get("bucket_slices", 0),
        "candidate_pairs": numbers.get("candidate_pairs", 0),
        "verified_pairs": numbers.get("verified_pairs", 0),
        "clusters_with_duplicates": numbers.get("clusters_with_duplicates", 0),
        # the connected components' hook rounds and pointer jumps (tasks/dedup/shuffle/components.py)
        "components_rounds": numbers.get("components_rounds", 0),
        "components_jumps": numbers.get("components_jumps", 0),
        "seconds_by_step": shuffle.seconds,
        "mode": config.mode,
        "threshold": config.threshold,
        "index_run": index_run,
        "index_entries_written": numbers.get("index_entries_written", 0),
        "weight_total": sum(o.facts["weight_total"] for o in outputs),
        "shingled_megabytes_per_second": round(text_megabytes / max(report.seconds, 1e-9), 3),
    }
    report.note = (
        f"{config.mode} mode, {report.extra['contents_hashed']} contents hashed, "
        f"{report.extra['published_in_input']} reused from {report.extra['published_documents']} published, "
        f"{config.buckets} buckets"
    )
    report.commit_metadata |= {"dedup_mode": config.mode, "index_run": index_run}
    return report
