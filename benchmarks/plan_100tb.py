"""A costed plan for a 100 TB curate run, computed from rates measured on this machine and from
stated assumptions.

Measured (``benchmarks/results/``): ingest + validate bytes per CPU-second of the whole stage
(``ingest_filter.json``, ``full_stage_once``); dedup as the shuffle, documents per core-second
of the memory bar (``scale.json``: wall seconds on 2 worker processes, 10,000-document parts)
plus shingling bytes per CPU-second (``dedup.json``); tokenize + shard bytes per core-second of
the stage on one worker with the tiktoken encoder, and with ``tokenizers`` for comparison
(``shard.json``); the Prefect + Dask overhead per partition task, contents, candidate pairs and
index bytes per document, and the connected components' rounds (``scale.json``). The scaling run's own per-core rates are
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
# a components task holds its bucket's parents (content key + parent) and edges, and about as
# much again while it sorts and joins them
COMPONENTS_BYTES_PER_NODE = 2 * (16 + 16)
COMPONENTS_BYTES_PER_EDGE = 2 * EDGE_BYTES
PREVIOUS_CORE_HOURS = 40_719  # this plan before the tiktoken encoder (docs/scale.md, at 5d1794c)
INDEX_ENTRY_BYTES = 16  # a bundle's index entry per receiver: offset and length


class MissingMeasurement(SystemExit):
    """A result file the plan reads is absent or lacks a figure; the message names the run to make."""


def measured(name: str, *keys: str, run: str) -> object:
    """``benchmarks/results/<name>`` at ``keys``, or one sentence naming the run that records it."""
    path = RESULTS / name
    try:
        value = json.loads(path.read_text())
        for key in keys:
            value = value[key]
    except (FileNotFoundError, KeyError, TypeError):
        where = f"{name} has no {'.'.join(keys)}" if path.exists() else f"{name} is missing"
        raise MissingMeasurement(f"plan_100tb: {where}; make it with `{run}` first") from None
    return value


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

    scale_run = (
        ".venv/bin/python benchmarks/scale.py --mb 6 --memory-docs 5100000 --memory-limit 600MiB "
        "--memory-buckets 50 --memory-part-docs 10000 --check-docs 2000 --memory-slice-bytes 4194304"
    )
    scale = json.loads(args.scale_json.read_text()) if args.scale_json.exists() else {}
    if "runs" not in scale or "workers" not in scale.get("memory_bar", {}):
        raise MissingMeasurement(
            f"plan_100tb: {args.scale_json} lacks its runs or memory bar; make it with `{scale_run}`"
        )
    one = scale["runs"]["1"]
    dedup_facts = one["dedup"]
    overhead_s = scale["overhead"]["seconds_per_task"]
    bar = scale["memory_bar"]
    ingest_run = ".venv/bin/python benchmarks/ingest_filter.py --stage"
    ingest_rate = float(measured("ingest_filter.json", "corpus", "bytes", run=ingest_run)) / float(
        measured("ingest_filter.json", "full_stage_once", "cpu_seconds", run=ingest_run)
    )  # bytes per core-second
    dedup_docs_rate = bar["documents"] / (
        bar["dedup_seconds"] * len(bar["workers"])
    )  # documents per core-second
    shingle_rate = (
        float(
            measured(
                "dedup.json", "megabytes_per_cpu_second", "ours", run=".venv/bin/python benchmarks/dedup.py"
            )
        )
        * 1e6
    )
    shard_run = ".venv/bin/python benchmarks/shard.py"
    shard_rates = measured("shard.json", "mb_per_core_second", run=shard_run)
    if not {"stage_tiktoken_1_worker", "stage_tokenizers_1_worker"} <= set(shard_rates):
        raise MissingMeasurement(
            f"plan_100tb: shard.json predates the tiktoken encoder; make it with `{shard_run}`"
        )
    shard_rate = shard_rates["stage_tiktoken_1_worker"] * 1e6
    shard_rate_tokenizers = shard_rates["stage_tokenizers_1_worker"] * 1e6

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
    shard_hours_tokenizers = text_kept / shard_rate_tokenizers / 3600
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
    rounds, jumps = bar.get("components_rounds", 0), bar.get("components_jumps", 0)
    # steps per bucket: needs, resolve, contents, pairs, attach, verify, partials, representatives,
    # decide, and the components' start, labels and (apply, send, propose) per round and
    # (answer, jump) per jump
    bucket_steps = 9 + 2 + 3 * rounds + 2 * jumps
    tasks["dedup"] += bucket_steps * buckets
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

    # The largest task of each kind, from the measured rises (sliced, whole-bucket) and sizes
    linked = contents * 2 * edges_per_content  # at most two contents per edge
    components_memory = (
        linked / buckets * COMPONENTS_BYTES_PER_NODE
        + edges / EDGE_BYTES / buckets * COMPONENTS_BYTES_PER_EDGE
    )
    task_memory = [
        (
            "dedup sliced step (contents, pairs, attach, verify): one slice",
            buckets,
            amplification * slice_bytes,
            "no: slice_bytes",
        ),
        (
            "dedup whole-bucket step (resolve, decide, ...): one bucket",
            buckets,
            docs_validated / buckets * bytes_per_bucket_doc,
            "no: buckets grow with it",
        ),
        (
            "dedup components / representatives: one bucket's nodes and edges",
            buckets,
            components_memory,
            "no: buckets grow with it",
        ),
    ]

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
    print(
        f"    tokenize + shard {shard_rate / 1e6:.3f} MB per core-second with tiktoken, "
        f"{shard_rate_tokenizers / 1e6:.3f} with tokenizers (shard.json, the stage on 1 worker)"
    )
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
        f"| dedup shuffle objects per part-to-bucket step (one bundle per producing part; was parts x buckets "
        f"= {parts * buckets:,}) | {parts:,} |"
    )
    print(
        f"| dedup shuffle objects per bucket-to-bucket step (one bundle per producing bucket; was {buckets**2:,}) "
        f"| {buckets:,} |"
    )
    print(
        f"| dedup shuffle ranged reads per part-to-bucket step (index entry + slice, per receiver and producer) "
        f"| {2 * parts * buckets:,} |"
    )
    print(
        f"| bundle index per producing part ({INDEX_ENTRY_BYTES} B per receiving bucket) | {human(INDEX_ENTRY_BYTES * buckets)} |"
    )
    print(f"| verified edges (all buckets; each components task holds its bucket's) | {human(edges)} |")
    print(
        f"| connected components: rounds x jumps (measured at {bar['documents']:,} documents) | {rounds} x {jumps} |"
    )
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
    print("| task (the largest of each kind) | tasks per step | its memory | grows with the corpus? |")
    print("|---|---|---|---|")
    for kind, count, memory, note in task_memory:
        print(f"| {kind} | {count:,} | {human(memory)} | {note} |")
    largest = max(task_memory, key=lambda row: row[2])
    print()
    previous_total = total_core_hours - core_hours["shard"] + shard_hours_tokenizers
    print(
        f"shard with tokenizers instead (same run of shard.json): {shard_hours_tokenizers:,.0f} core-hours, "
        f"total {previous_total:,.0f}; tiktoken's stage is {shard_rate / shard_rate_tokenizers:.2f}x per core"
    )
    print(
        f"total {total_core_hours:,.0f} core-hours = {total_core_hours / PREVIOUS_CORE_HOURS:.0%} of the "
        f"{PREVIOUS_CORE_HOURS:,} this plan printed before the tiktoken encoder"
    )
    print(
        f"plan_100tb: core_hours={total_core_hours:,.0f} largest_task={human(largest[2])} "
        f"objects_per_part_step={parts:,} cores_for_{args.hours:g}h={cores} "
        f"shuffle={human(sum(shuffle.values()))} index={human(docs_validated * index_bytes_per_doc)} shards={shards}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
