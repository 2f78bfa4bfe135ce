"""A costed plan for a 100 TB curate run, computed from the rates ``benchmarks/scale.py`` measured
on this machine (``benchmarks/results/scale.json``, its 1-worker run) and from stated assumptions.

Every figure is arithmetic on those two: per-core MB/s of each stage group, documents and
tokens per byte, dedup candidate pairs per content, index bytes per document, the measured
Prefect + Dask overhead per partition task. The assumptions (``--flag`` = default) are printed
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
    parser.add_argument("--doc-kb", type=float, default=4.0, help="mean raw bytes per document, KB (web text: 3-5)")
    parser.add_argument("--validate-kept", type=float, default=0.7, help="fraction the quality rules keep")
    parser.add_argument("--dedup-kept", type=float, default=0.7, help="fraction dedup keeps")
    parser.add_argument("--bytes-per-token", type=float, default=4.0, help="a 50k BPE on English web text")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--sequences-per-shard", type=int, default=65_536, help="ShardConfig.max_sequences_per_shard")
    parser.add_argument("--partition-mib", type=float, default=256.0, help="IngestConfig.partition_bytes, MiB")
    parser.add_argument("--lakefs-puts-per-s", type=float, default=500.0,
                        help="staged object writes per second per worker against lakeFS (not measured here)")
    parser.add_argument("--worker-memory-gib", type=float, default=4.0, help="memory per worker process (per core)")
    parser.add_argument("--hours", type=float, default=24.0, help="wall-clock budget")
    parser.add_argument("--cores-per-node", type=int, default=32)
    parser.add_argument("--efficiency", type=float, default=0.8,
                        help="fraction of the cluster's core-hours doing stage work (stragglers, the shuffle's waits)")
    args = parser.parse_args()

    scale = json.loads(args.scale_json.read_text())
    one = scale["runs"]["1"]
    stages = one["stages"]
    dedup_facts = one["dedup"]
    overhead_s = scale["overhead"]["seconds_per_task"]

    raw = args.corpus_tb * TB
    docs_in = raw / (args.doc_kb * 1e3)
    docs_validated = docs_in * args.validate_kept
    docs_kept = docs_validated * args.dedup_kept
    text_validated = raw * args.validate_kept
    text_kept = text_validated * args.dedup_kept
    tokens = text_kept / args.bytes_per_token
    partition = args.partition_mib * 2**20
    parts = math.ceil(raw / partition)

    # Per-core rates, measured (MB/s of the stage's input text on one worker process).
    rate = {name: stages[name]["mb_per_s_per_core"] * 1e6 for name in ("ingest+validate", "dedup", "shard")}
    work_bytes = {"ingest+validate": raw, "dedup": text_validated, "shard": text_kept}
    core_hours = {name: work_bytes[name] / rate[name] / 3600 for name in rate}
    tasks = {"ingest+validate": 2 * parts, "dedup": 4 * parts, "shard": parts}  # partition tasks per stage group
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
    # buckets so that one bucket's signatures and band keys take a quarter of a worker's memory
    bucket_budget = args.worker_memory_gib * 2**30 / 4
    buckets = 2 ** math.ceil(math.log2(contents * (num_perm_bytes + bands * 8) / bucket_budget))
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
    print(f"  measured (benchmarks/results/scale.json, 1 worker, load average {scale['machine']['load_average_start'][0]:.1f}):")
    for name in rate:
        print(f"    {name}: {rate[name] / 1e6:.2f} MB/s per core")
    print(f"    overhead per partition task: {overhead_s * 1000:.0f} ms; contents per document {contents_per_doc:.3f}; "
          f"candidate pairs per content {pairs_per_content:.3f}; verified {edges_per_content:.3f}; "
          f"index {index_bytes_per_doc:.0f} B per document")
    print()
    print(f"| stage | documents in | bytes in | core-hours (work) | core-hours (task overhead, {len(tasks)} groups) |")
    print("|---|---|---|---|---|")
    docs = {"ingest+validate": docs_in, "dedup": docs_validated, "shard": docs_kept}
    for name in rate:
        print(f"| {name} | {human(docs[name], '')} | {human(work_bytes[name])} | {core_hours[name]:,.0f} "
              f"| {overhead_hours[name]:,.1f} ({tasks[name]:,} tasks) |")
    print(f"| **total** | | | **{sum(core_hours.values()):,.0f}** | {sum(overhead_hours.values()):,.1f} |")
    print()
    print("| quantity | value |")
    print("|---|---|")
    print(f"| ingest partitions ({args.partition_mib:g} MiB) | {parts:,} |")
    for what, size in shuffle.items():
        print(f"| dedup shuffle: {what} | {human(size)} |")
    print(f"| dedup shuffle: total | {human(sum(shuffle.values()))} |")
    print(f"| dedup buckets (DedupConfig.buckets; a bucket's signatures + band keys = 1/4 of {args.worker_memory_gib:g} GiB) "
          f"| {buckets:,} |")
    print(f"| verified edges (the union-find's input) | {human(edges)} |")
    print(f"| dedup index (`index/minhash/`, {index_bytes_per_doc:.0f} B per document) | {human(docs_validated * index_bytes_per_doc)} |")
    print(f"| tokens | {human(tokens, '')} |")
    print(f"| shards ({args.sequences_per_shard:,} x {args.seq_len + 1} uint16 = {human(shard_bytes)} each) | {shards:,} |")
    for stage, count in objects.items():
        minutes = count / (args.lakefs_puts_per_s * cores / args.cores_per_node) / 60
        print(f"| lakeFS objects staged by the {stage} commit | {count:,.0f} ({minutes:.1f} min of puts over "
              f"{cores // args.cores_per_node} nodes) |")
    print(f"| cores for {args.hours:g} h at {args.efficiency:.0%} efficiency | {cores:,} "
          f"({math.ceil(cores / args.cores_per_node):,} nodes of {args.cores_per_node}) |")
    print()
    print(f"plan_100tb: core_hours={total_core_hours:,.0f} cores_for_{args.hours:g}h={cores} "
          f"shuffle={human(sum(shuffle.values()))} index={human(docs_validated * index_bytes_per_doc)} shards={shards}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
