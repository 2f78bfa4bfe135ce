"""A costed plan for a 100 TB curate run, computed from rates measured on this machine and from
stated assumptions.

Measured (``benchmarks/results/``): ingest + validate bytes per CPU-second of the whole stage
(``ingest_filter.json``, ``full_stage_once``); dedup as the shuffle, documents per core-second
of the memory bar (``scale.json``: wall seconds on 2 worker processes, 10,000-document parts)
plus shingling bytes per CPU-second (``dedup.json``); tokenize + shard bytes per second on one
worker (``shard.json``); the Prefect + Dask overhead per partition task, and contents, candidate
pairs and index bytes per document (``scale.json``). The scaling run's own per-core rates are
not used for throughput: its partitions are tiny on purpose, so it measures overhead. The assumptions (``--flag`` = default) are printed
with the table; change one and the table follows. ``docs/scale.md`` holds the table and what
it means.

    .venv/bin/python benchmarks/plan_100tb.py [--corpus-tb 100] [--partition-mib 256] [--hours 24]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tasks.dedup.config import DedupConfig  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
TB = 1e12
BAND_RECORD_BYTES = 4 + 8 + 16  # band (int32), band key (uint64), content key (16 bytes)
EDGE_BYTES = 2 * 16  # a verified pair: two content keys


def human(n: float, unit: str = "B") -> str:
    for prefix in ("", "K", "M", "G", "T", "P"):
        if abs(n) < 1000:
            return f"{n:.3g} {prefix}{unit}"
        n /= 1000
    return f"{n:.3g} E{unit}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale-json", type=Path, default=RESULTS / "scale.json")
    parser.add_argument("--corpus-tb", type=float, default=100.0, help="raw JSONL input, TB")
    parser.add_argument(
        "--doc-kb", type=float, default=4.0, help="mean raw bytes per document, KB (web text: 3-5)"
    )
    parser.add_argument("--validate-kept", type=float, default=0.7, help="fraction the quality rules keep")
    parser.add_argument("--dedup-kept", type=float, default=0.7, help="fraction dedup keeps")
    parser.add_argument("--bytes-per-token", type=float, default=4.0, help="a 50k BPE on English web text")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument(
        "--sequences-per-shard", type=int, default=65_536, help="ShardConfig.max_sequences_per_shard"
    )
    parser.add_argument(
        "--partition-mib", type=float, default=256.0, help="IngestConfig.partition_bytes, MiB"
    )
    parser.add_argument(
        "--lakefs-puts-per-s",
        type=float,
        default=500.0,
        help="staged object writes per second per worker against lakeFS (not measured here)",
    )
    parser.add_argument(
        "--worker-memory-gib", type=float, default=4.0, help="memory per worker process (per core)"
    )
    parser.add_argument("--hours", type=float, default=24.0, help="wall-clock budget")
    parser.add_argument("--cores-per-node", type=int, default=32)
    parser.add_argument(
        "--efficiency",
        type=float,
        default=0.8,
        help="fraction of the cluster's core-hours doing stage work (stragglers, the shuffle's waits)",
    )
    args = parser.parse_args()

    scale = json.loads(args.scale_json.read_text())
    one = scale["runs"]["1"]
    dedup_facts = one["dedup"]
    overhead_s = scale["overhead"]["seconds_per_task"]
    ingest = json.loads((RESULTS / "ingest_filter.json").read_text())
    dedup_bench = json.loads((RESULTS / "dedup.json").read_text())
    shard_bench = json.loads((RESULTS / "shard.json").read_text())
    bar = scale["memory_bar"]
    ingest_rate = (
        ingest["corpus"]["bytes"] / ingest["full_stage_once"]["cpu_seconds"]
    )  # bytes per core-second
    dedup_docs_rate = bar["documents"] / (
        bar["dedup_seconds"] * len(bar["workers"])
    )  # documents per core-second
    shingle_rate = dedup_bench["megabytes_per_cpu_second"]["ours"] * 1e6
    shard_rate = shard_bench["rates_mb_per_s"]["end_to_end_1_worker"] * 1e6

    raw = args.corpus_tb * TB
    docs_in = raw / (args.doc_kb * 1e3)
    docs_validated = docs_in * args.validate_kept
    docs_kept = docs_validated * args.dedup_kept
    text_validated = raw * args.validate_kept
    text_kept = text_validated * args.dedup_kept
    tokens = text_kept / args.bytes_per_token
    partition = args.partition_mib * 2**20
    parts = math.ceil(raw / partition)

    work_bytes = {"ingest+validate": raw, "dedup": text_validated, "shard": text_kept}
    core_hours = {
        "ingest+validate": raw / ingest_rate / 3600,
        "dedup": (docs_validated / dedup_docs_rate + text_validated / shingle_rate) / 3600,
        "shard": text_kept / shard_rate / 3600,
    }
    # partition tasks: ingest and validate one each per partition; dedup's per-part steps (keys,
    # signatures, apply) and about 8 steps per bucket (below); shard about one per 256 MiB of text
    tasks = {"ingest+validate": 2 * parts, "dedup": 3 * parts, "shard": parts}
    overhead_hours = {name: tasks[name] * overhead_s / 3600 for name in tasks}
    total_core_hours = sum(core_hours.values()) + sum(overhead_hours.values())
    cores = math.ceil(total_core_hours / (args.hours * args.efficiency))

    # Dedup: what is shuffled and what is kept, from the measured run's ratios.
    contents_per_doc = dedup_facts["contents"] / one["documents"]["validated"]
    contents = docs_validated * contents_per_doc
    bands = dedup_facts["bands"]
    num_perm_bytes = DedupConfig().num_perm * 4  # the benchmark ran the default config
    pairs_per_content = dedup_facts["candidate_pairs"] / max(dedup_facts["contents"], 1)
    edges_per_content = dedup_facts["verified_pairs"] / max(dedup_facts["contents"], 1)
    shuffle = {
        "band records (band-key buckets)": contents * bands * BAND_RECORD_BYTES,
        "signatures (content buckets)": contents * num_perm_bytes,
        "candidate pairs + attached signature": contents * pairs_per_content * (EDGE_BYTES + num_perm_bytes),
    }
    edges = contents * edges_per_content * EDGE_BYTES
    # Worker memory, from the memory bar's per-step peaks (MB during the step, and after it):
    # a sliced step (contents) rises over the previous step's resting RSS by about A x slice_bytes;
    # a step that reads its bucket whole (resolve) by about R bytes per document of the bucket.
    # Slices and buckets are sized so that each takes half of a worker's memory.
    steps = bar["worker_peak_and_after_mb_by_step"]
    mib = 2**20
    contents_rise = max(c[0] - r[1] for c, r in zip(steps["contents"], steps["resolve"], strict=True)) * mib
    amplification = max(contents_rise / bar["slice_bytes"], 1.0)
    resolve_rise = max(r[0] - s[1] for r, s in zip(steps["resolve"], steps["signatures"], strict=True)) * mib
    bytes_per_bucket_doc = max(resolve_rise / (bar["documents"] / bar["buckets"]), 1.0)
    half_worker = args.worker_memory_gib * 2**30 / 2
    slice_bytes = 2 ** math.floor(math.log2(half_worker / amplification))
    buckets = 2 ** math.ceil(math.log2(docs_validated * bytes_per_bucket_doc / half_worker))
    tasks["dedup"] += 8 * buckets
    index_bytes_per_doc = dedup_facts["index_bytes"] / one["documents"]["validated"]

    # Shards: uint16 tokens (vocab < 65,536), rows of seq_len + 1.
    sequences = tokens / args.seq_len
    shard_bytes = args.sequences_per_shard * (args.seq_len + 1) * 2
    shards = math.ceil(sequences / args.sequences_per_shard)

    # lakeFS: objects each stage commit stages (parts + quarantine parts; dedup also its index).
    quarantine_share = 1.0  # a quarantine part per input part, at most
    objects = {
        "ingest": parts,
        "validate": parts * (1 + quarantine_share),
        "dedup": parts * (1 + quarantine_share) + 2 * buckets,  # index: documents/ and contents/ per bucket
        "shard": shards + 1,
    }

    print("assumptions:")
    for key, value in vars(args).items():
        if key != "scale_json":
            print(f"  --{key.replace('_', '-')} = {value}")
    print("  measured (benchmarks/results/):")
    print(f"    ingest+validate {ingest_rate / 1e6:.2f} MB per core-second (ingest_filter.json, whole stage)")
    print(
        f"    dedup shuffle {dedup_docs_rate:.0f} documents per core-second (scale.json memory bar) "
        f"+ shingling {shingle_rate / 1e6:.1f} MB per core-second (dedup.json)"
    )
    print(f"    tokenize + shard {shard_rate / 1e6:.3f} MB per core-second (shard.json, 1 worker)")
    print(
        f"    overhead per partition task: {overhead_s * 1000:.0f} ms; contents per document {contents_per_doc:.3f}; "
        f"candidate pairs per content {pairs_per_content:.3f}; verified {edges_per_content:.3f}; "
        f"index {index_bytes_per_doc:.0f} B per document"
    )
    print()
    print("| stage | documents in | bytes in | core-hours (work) | core-hours (Prefect + Dask overhead) |")
    print("|---|---|---|---|---|")
    docs = {"ingest+validate": docs_in, "dedup": docs_validated, "shard": docs_kept}
    for name in core_hours:
        print(
            f"| {name} | {human(docs[name], '')} | {human(work_bytes[name])} | {core_hours[name]:,.0f} "
            f"| {overhead_hours[name]:,.1f} ({tasks[name]:,} tasks) |"
        )
    print(f"| **total** | | | **{sum(core_hours.values()):,.0f}** | {sum(overhead_hours.values()):,.1f} |")
    print()
    print("| quantity | value |")
    print("|---|---|")
    print(f"| ingest partitions ({args.partition_mib:g} MiB) | {parts:,} |")
    for what, size in shuffle.items():
        print(f"| dedup shuffle: {what} | {human(size)} |")
    print(f"| dedup shuffle: total | {human(sum(shuffle.values()))} |")
    print(
        f"| dedup slice_bytes (a sliced step rises {amplification:.1f}x its slice; = 1/2 of {args.worker_memory_gib:g} GiB) "
        f"| {human(slice_bytes)} |"
    )
    print(
        f"| dedup buckets (a whole-bucket step holds {bytes_per_bucket_doc:.0f} B per document; = 1/2 of "
        f"{args.worker_memory_gib:g} GiB) | {buckets:,} |"
    )
    print(
        f"| dedup shuffle objects per part-to-bucket step (one per producing part and receiving bucket) "
        f"| {parts * buckets:,} |"
    )
    print(
        f"| dedup shuffle objects per bucket-to-bucket step (one per producing and receiving bucket) | {buckets**2:,} |"
    )
    print(f"| verified edges (the union-find's input) | {human(edges)} |")
    print(
        f"| dedup index (`index/minhash/`, {index_bytes_per_doc:.0f} B per document) | {human(docs_validated * index_bytes_per_doc)} |"
    )
    print(f"| tokens | {human(tokens, '')} |")
    print(
        f"| shards ({args.sequences_per_shard:,} x {args.seq_len + 1} uint16 = {human(shard_bytes)} each) | {shards:,} |"
    )
    for stage, count in objects.items():
        minutes = count / (args.lakefs_puts_per_s * cores) / 60
        print(
            f"| lakeFS objects staged by the {stage} commit | {count:,.0f} ({minutes:.2f} min of puts from "
            f"{cores:,} workers) |"
        )
    print(
        f"| cores for {args.hours:g} h at {args.efficiency:.0%} efficiency | {cores:,} "
        f"({math.ceil(cores / args.cores_per_node):,} nodes of {args.cores_per_node}) |"
    )
    print()
    print(
        f"plan_100tb: core_hours={total_core_hours:,.0f} cores_for_{args.hours:g}h={cores} "
        f"shuffle={human(sum(shuffle.values()))} index={human(docs_validated * index_bytes_per_doc)} shards={shards}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
