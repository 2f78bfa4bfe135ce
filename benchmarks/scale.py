"""Past one machine, measured on this one: the curate stages on 1 and 2 Dask worker processes,
the Prefect + Dask overhead per partition task, and dedup over a corpus far larger than one
worker's memory limit.

1. **Scaling.** A generated corpus (JSONL sources of prose with planted duplicates) goes through
   ingest + validate, dedup and shard (``run_stage``, partitions as Prefect tasks on a
   ``DaskTaskRunner``) on a ``LocalCluster`` of 1, then 2 worker processes (one thread each).
   Per stage group: seconds, documents/s and MB/s, and the same per core (per worker). The
   2-worker run must publish the same bytes as the 1-worker run (checked).
2. **Overhead.** The same stages on the same partitions once more in this process, one after
   the other, without Prefect or Dask (``workers`` 0): the work itself. The 1-worker cluster's
   extra time over it, divided by its partition tasks, is what Prefect (task runs, states) and
   Dask (scheduling, transfer) add to each task; against the in-process rate of ingest +
   validate it gives the overhead at a partition size and the smallest partition for which it
   stays under 5%. A no-op task mapped 40 times is timed too, as a floor.
3. **Memory bar** (a subprocess, so its peak RSS is its own): ``--memory-docs`` short documents
   are deduplicated on a 2-worker ``LocalCluster`` whose ``memory_limit`` (Dask's nanny kills a
   worker past 95% of it) is ``--memory-limit``; the in-memory plan would hold their signatures
   and band keys, ``(num_perm * 4 + bands * 8)`` bytes each. Peak RSS during the dedup of the
   process that runs the stage and of each worker, step by step (``VmHWM``, reset before each
   step; worker pids checked unchanged: no worker was killed). A corpus that fits
   (``--check-docs``) is deduplicated both ways, its buckets cut in slices
   (``--check-slice-bytes``), and must give the same decisions.

The machine is shared and small: the load average is recorded, and 2 worker processes on 2
busy cores cannot show a clean 2x. Results: ``benchmarks/results/scale.json``. Last line:
``scale: speedup_2w=<x> overhead=<y>% dedup_peak_rss_mb=<z>`` (overhead at the default 16 MiB
ingest partition; the largest peak RSS of the memory bar's workers and stage process).

    .venv/bin/python benchmarks/scale.py [--mb 24] [--memory-docs 500000] [--memory-limit 600MiB]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_HOME", str(ROOT / ".prefect" / "benchmark"))
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tasks.dedup.config import DedupConfig  # noqa: E402
from tests.flows.curate_support import prose_document  # noqa: E402 - sentences the quality rules accept

RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_PARTITION = 16 * 2**20  # IngestConfig.partition_bytes
WORDS = [f"{a}{b}{c}" for a in "bcdfghjklmnprstvz" for b in "aeiou" for c in "lmnrst"]


def document(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def write_sources(root: Path, megabytes: float, sources: int = 4, seed: int = 0) -> list[dict[str, Any]]:
    """``sources`` JSONL files of prose (~2 KB documents), 10% exact and 10% near copies."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    per_source = int(megabytes * 1e6 / sources)
    configs = []
    for s in range(sources):
        path = root / f"source{s}.jsonl"
        written, texts = 0, []
        with path.open("w") as out:
            while written < per_source:
                roll = rng.random()
                if texts and roll < 0.1:
                    text = rng.choice(texts)
                elif texts and roll < 0.2:
                    words = rng.choice(texts).split()
                    words[rng.randrange(len(words))] = "edited"
                    text = " ".join(words)
                else:
                    text = prose_document(rng, rng.randint(200, 450))
                    texts.append(text)
                line = json.dumps({"text": text}) + "\n"
                out.write(line)
                written += len(line)
        configs.append({"name": f"web{s}", "kind": "prose", "format": "jsonl", "path": str(path)})
    return configs


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cluster_runner(workers: int, memory_limit: str = "auto"):
    from flows.runners import partitions_on

    return partitions_on("dask", workers, memory_limit)


class CountingMap:
    """The partition map in force, counting the partitions it is given (the tasks a runner runs)."""

    def __init__(self, inner: Any):
        self.inner, self.items = inner, 0

    def map(self, name: str, work: Any, items: Any, retries: int = 0, describe: Any = None) -> Any:
        self.items += len(items)
        return self.inner.map(name, work, items, retries, describe)


def run_stages(work: Path, sources: list[dict[str, Any]], workers: int, corpus_bytes: int) -> dict[str, Any]:
    """ingest + validate, dedup, shard on a fresh repository; seconds and rates per stage group.
    ``workers`` 0: the same partitions one after the other in this process, no Prefect and no Dask
    (the baseline of the overhead)."""
    from flows.runners import partitions_on
    from tasks.dedup.stage import run_dedup
    from tasks.ingest.config import IngestConfig
    from tasks.ingest.stage import run_ingest
    from tasks.partition_map import partitions, use
    from tasks.shard.config import ShardConfig
    from tasks.shard.stage import run_shard
    from tasks.stage import run_stage
    from tasks.validate.config import ValidateConfig
    from tasks.validate.stage import run_validate
    from versioning.local import LocalRepo

    repo = LocalRepo(work / f"repo-{workers}w")
    repo.ensure()
    runner = cluster_runner(workers) if workers else partitions_on("local", 1)
    partition = max(corpus_bytes // 24, 1 << 16)
    ingest = IngestConfig.model_validate({"sources": sources, "partition_bytes": partition})
    groups: dict[str, Any] = {}
    with runner, use(CountingMap(partitions())) as counter:
        head = repo.resolve("main")
        started = time.perf_counter()
        ingested = run_stage(run_ingest, repo, "main", head, ingest)
        validated = run_stage(run_validate, repo, "main", ingested.commit_id, ValidateConfig())
        groups["ingest+validate"] = (time.perf_counter() - started, ingested.report["documents_in"])
        started = time.perf_counter()
        deduped = run_stage(run_dedup, repo, "main", validated.commit_id, DedupConfig(buckets=8))
        groups["dedup"] = (time.perf_counter() - started, deduped.report["documents_in"])
        started = time.perf_counter()
        sharded = run_stage(run_shard, repo, "main", deduped.commit_id, ShardConfig(vocab_size=2048))
        groups["shard"] = (time.perf_counter() - started, sharded.report["documents_in"])
    manifest = json.loads(repo.get(sharded.commit_id, "shards/manifest.json"))
    text_mb = {
        "ingest+validate": corpus_bytes / 1e6,
        "dedup": deduped.report["extra"]["shingled_megabytes"],
        "shard": sharded.report["extra"]["text_megabytes"],
    }
    result = {
        "workers": workers,
        "partition_tasks": counter.items,
        "ingest_partitions": ingested.report["per_source"]["web0"]["partitions"] * len(sources),
        "ingest_partition_bytes": partition,
        "shards": {s["name"]: s["sha256"] for s in manifest["shards"]},
        "shard_bytes": sum(s["bytes"] for s in manifest["shards"]),
        "tokens": manifest["totals"]["tokens"],
        "dedup": {
            k: deduped.report["extra"].get(k)
            for k in ("contents", "candidate_pairs", "verified_pairs", "bands")
        }
        | {
            "index_bytes": sum(s.size for s in repo.list(deduped.commit_id, "index/minhash/")),
            "index_objects": sum(1 for _ in repo.list(deduped.commit_id, "index/minhash/")),
        },
        "objects_changed_per_stage_commit": {
            stage: len(repo.diff(before, after))
            for stage, before, after in (
                ("ingest", head, ingested.commit_id),
                ("validate", ingested.commit_id, validated.commit_id),
                ("dedup", validated.commit_id, deduped.commit_id),
                ("shard", deduped.commit_id, sharded.commit_id),
            )
        },
        "documents": {
            "ingested": ingested.report["kept"],
            "validated": validated.report["kept"],
            "deduplicated": deduped.report["kept"],
        },
        "stages": {},
    }
    for name, (seconds, documents) in groups.items():
        result["stages"][name] = {
            "seconds": round(seconds, 3),
            "documents": documents,
            "megabytes": round(text_mb[name], 3),
            "docs_per_s": round(documents / seconds, 1),
            "mb_per_s": round(text_mb[name] / seconds, 3),
            "docs_per_s_per_core": round(documents / seconds / max(workers, 1), 1),
            "mb_per_s_per_core": round(text_mb[name] / seconds / max(workers, 1), 3),
        }
    repo.close()
    return result


def noop(item: int) -> int:
    return item


def task_overhead(tasks: int = 40) -> float:
    """Seconds per partition task of a 1-worker cluster when the work itself is nothing."""
    from tasks.partition_map import partitions

    with cluster_runner(1):
        list(partitions().map("noop", noop, list(range(4))))  # warm: imports on the worker
        started = time.perf_counter()
        assert list(partitions().map("noop", noop, list(range(tasks)))) == list(range(tasks))
        return (time.perf_counter() - started) / tasks


# ---- the memory bar (run in a subprocess) --------------------------------------------------


def short_documents(first: int, count: int, seed: int) -> Any:
    """``count`` short documents (~45 words); every 10th a near copy of an earlier one in its part."""
    import pyarrow as pa

    from tasks.schema import document_id

    rng = random.Random(seed * 1_000_003 + first)
    texts = []
    for i in range(count):
        if i % 10 == 9:
            words = texts[rng.randrange(len(texts))].split()
            words[rng.randrange(len(words))] = "edited"
            texts.append(" ".join(words))
        else:
            texts.append(document(rng, rng.randint(35, 55)))
    locators = [f"doc-{first + i:09d}" for i in range(count)]
    return pa.table(
        {
            "id": [document_id("web", loc) for loc in locators],
            "source": ["web"] * count,
            "text": texts,
            "locator": locators,
            "meta": ["{}"] * count,
        }
    )


def put_corpus(repo: Any, documents: int, per_part: int = 5_000, seed: int = 1) -> str:
    from tasks.parts import put_table

    for part, first in enumerate(range(0, documents, per_part)):
        table = short_documents(first, min(per_part, documents - first), seed)
        put_table(repo, "main", f"filtered/web/part-{part:05d}.parquet", table)
    return repo.commit("main", f"{documents} filtered documents", {"stage": "validate"}).id


def worker_peaks() -> dict[str, Any]:
    import psutil

    return {
        "pid": os.getpid(),
        "peak_rss_mb": peak_rss_mb(),
        "rss_mb": psutil.Process().memory_info().rss / 2**20,
    }


def step_peak_mb(reset: bool) -> float:
    """This process's RSS high-water mark since the last reset (``VmHWM``; Linux resets it when
    ``5`` is written to ``clear_refs``), then reset it if asked."""
    status = Path("/proc/self/status").read_text()
    peak = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")) / 1024
    if reset:
        Path("/proc/self/clear_refs").write_text("5")
    return peak


@contextmanager
def workers_sampled_after_each_step(client: Any) -> Iterator[dict[str, Any]]:
    """Each step of the dedup shuffle: every worker's peak RSS during the step and its RSS after
    it (MB), so the step that sets a worker's peak can be read off."""
    from tasks.dedup.shuffle import ShuffleStats

    by_step: dict[str, Any] = {}
    step = ShuffleStats.step

    def sampled(self: ShuffleStats, name: str, work: Any, items: Any) -> dict[str, int]:
        client.run(step_peak_mb, True)
        counts = step(self, name, work, items)
        peaks = client.run(step_peak_mb, False)
        after = client.run(worker_peaks)
        # a step run several times (the components' rounds): its highest peak, the last "after"
        seen = by_step.get(name, {})
        by_step[name] = {
            a: [max(round(peaks[a]), seen.get(a, [0])[0]), round(after[a]["rss_mb"])]
            for a in sorted(after)
            if a in peaks
        }
        return counts

    ShuffleStats.step = sampled
    try:
        yield by_step
    finally:
        ShuffleStats.step = step


def memory_bar(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Dedup of ``--memory-docs`` documents on a 2-worker cluster limited to ``--memory-limit``."""
    import pyarrow as pa
    from dask.utils import parse_bytes

    from tasks.dedup import deduplicate
    from tasks.dedup.stage import run_dedup
    from tasks.parts import read_parts
    from tasks.stage import run_stage
    from versioning.local import LocalRepo

    config = DedupConfig(buckets=args.memory_buckets, slice_bytes=args.memory_slice_bytes)
    bands, _ = config.banding
    limit = parse_bytes(args.memory_limit)
    out: dict[str, Any] = {
        "documents": args.memory_docs,
        "memory_limit_mb": round(limit / 2**20, 1),
        "buckets": config.buckets,
        "slice_bytes": config.slice_bytes,
    }
    with cluster_runner(2, args.memory_limit) as runner:
        client = runner.client
        idle = client.run(worker_peaks)

        # a corpus that fits: the shuffle, its buckets cut in slices as the big run's are, and
        # the in-memory plan decide the same
        small = LocalRepo(work / "small")
        small.ensure()
        commit = put_corpus(small, args.check_docs, per_part=5_000, seed=2)
        sliced = config.model_copy(update={"slice_bytes": args.check_slice_bytes})
        result = run_stage(run_dedup, small, "main", commit, sliced)
        kept, quarantined, _ = deduplicate(list(read_parts(small, commit, "filtered/web")), config)
        stored = pa.concat_tables(read_parts(small, result.commit_id, "dedup"))
        stored_kept = sorted(
            zip(stored.column("id").to_pylist(), stored.column("dup_cluster").to_pylist(), strict=True)
        )
        expected_kept = sorted(
            zip(kept.column("id").to_pylist(), kept.column("dup_cluster").to_pylist(), strict=True)
        )
        out["check"] = {
            "documents": args.check_docs,
            "removed": quarantined.num_rows,
            "identical_to_in_memory": stored_kept == expected_kept and result.report["kept"] == kept.num_rows,
            "bucket_slices": result.report["extra"]["bucket_slices"],
        }

        repo = LocalRepo(work / "big")
        repo.ensure()
        started = time.perf_counter()
        commit = put_corpus(repo, args.memory_docs, per_part=args.memory_part_docs)
        out["generate_seconds"] = round(time.perf_counter() - started, 1)
        rss_before = step_peak_mb(reset=True)  # generating the corpus and the check are not the flow's
        started = time.perf_counter()
        with workers_sampled_after_each_step(client) as by_step:
            result = run_stage(run_dedup, repo, "main", commit, config)
        out["dedup_seconds"] = round(time.perf_counter() - started, 1)
        peaks = client.run(worker_peaks)
    out["removed"] = result.report["documents_in"] - result.report["kept"]
    # each step resets a worker's high-water mark, so its peak is the largest of its steps'
    step_peaks = {a: max([s[a][0] for s in by_step.values() if a in s], default=0) for a in peaks}
    out["workers"] = [  # a restarted worker has a new address and no idle figure
        {
            "peak_rss_mb": round(max(p["peak_rss_mb"], step_peaks[a]), 1),
            "idle_rss_mb": round(idle[a]["rss_mb"], 1) if a in idle else None,
        }
        for a, p in peaks.items()
    ]
    out["workers_restarted"] = sorted(peaks) != sorted(idle) or any(
        peaks[a]["pid"] != idle[a]["pid"] for a in peaks if a in idle
    )
    out["stage_process_peak_rss_mb"] = round(step_peak_mb(reset=False), 1)  # during the dedup
    out["stage_process_peak_rss_before_dedup_mb"] = round(rss_before, 1)
    in_memory_bytes = args.memory_docs * (config.num_perm * 4 + bands * 8)
    out["in_memory_signatures_and_band_keys_mb"] = round(in_memory_bytes / 2**20, 1)
    out["corpus_over_memory_limit"] = round(in_memory_bytes / limit, 2)
    idle_rss = max(w["rss_mb"] for w in idle.values()) * 2**20
    out["corpus_over_limit_minus_idle_worker"] = round(in_memory_bytes / max(limit - idle_rss, 1), 2)
    out["text_mb"] = result.report["extra"]["shingled_megabytes"]
    out["seconds_by_step"] = result.report["extra"]["seconds_by_step"]
    out["bucket_slices"] = result.report["extra"]["bucket_slices"]
    out["components_rounds"] = result.report["extra"]["components_rounds"]
    out["components_jumps"] = result.report["extra"]["components_jumps"]
    out["worker_peak_and_after_mb_by_step"] = {name: list(w.values()) for name, w in by_step.items()}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=24.0, help="corpus of the scaling runs, MB of JSONL")
    parser.add_argument("--memory-docs", type=int, default=500_000, help="documents of the memory bar")
    parser.add_argument("--memory-limit", default="600MiB", help="LocalCluster memory_limit per worker")
    parser.add_argument(
        "--memory-buckets", type=int, default=64, help="DedupConfig.buckets of the memory bar"
    )
    parser.add_argument(
        "--memory-part-docs", type=int, default=5_000, help="documents per input part of the memory bar"
    )
    parser.add_argument(
        "--memory-slice-bytes",
        type=int,
        default=DedupConfig().slice_bytes,
        help="DedupConfig.slice_bytes of the memory bar",
    )
    parser.add_argument(
        "--check-docs", type=int, default=30_000, help="documents of the in-memory comparison"
    )
    parser.add_argument(
        "--check-slice-bytes",
        type=int,
        default=64 << 10,
        help="DedupConfig.slice_bytes of the in-memory comparison (small: its buckets are cut too)",
    )
    parser.add_argument("--memory-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--skip-memory", action="store_true", help="scaling and overhead only")
    parser.add_argument("--output", type=Path, default=RESULTS / "scale.json")
    args = parser.parse_args()

    from prefect.testing.utilities import prefect_test_harness

    if args.memory_only:
        with (
            prefect_test_harness(server_startup_timeout=180),
            tempfile.TemporaryDirectory(prefix="tokenlake-scale-memory-") as work,
        ):
            print(json.dumps(memory_bar(args, Path(work))))
        return 0

    load_before = os.getloadavg()
    with (
        tempfile.TemporaryDirectory(prefix="tokenlake-scale-") as temporary,
        prefect_test_harness(server_startup_timeout=180),
    ):
        work = Path(temporary)
        sources = write_sources(work / "sources", args.mb)
        corpus_bytes = sum(Path(s["path"]).stat().st_size for s in sources)
        runs = {w: run_stages(work, sources, w, corpus_bytes) for w in (0, 1, 2)}
        noop_s = task_overhead()
    assert runs[0]["shards"] == runs[1]["shards"] == runs[2]["shards"], (
        "every runner must write the same shards"
    )

    base, one, two = runs[0]["stages"], runs[1]["stages"], runs[2]["stages"]
    total = {w: sum(s["seconds"] for s in runs[w]["stages"].values()) for w in (0, 1, 2)}
    speedup = total[1] / total[2]
    # the work itself, timed without Prefect or Dask on the same partitions in the same run
    rate = base["ingest+validate"]["megabytes"] * 1e6 / base["ingest+validate"]["seconds"]  # bytes/s, 1 core
    per_task = max(total[1] - total[0], 0.0) / runs[1]["partition_tasks"]
    overhead = {
        "partition_tasks": runs[1]["partition_tasks"],
        "in_process_seconds": round(total[0], 3),
        "dask_1_worker_seconds": round(total[1], 3),
        "run_percent": round(100 * (total[1] - total[0]) / total[0], 2),
        "per_stage_percent": {
            n: round(100 * (one[n]["seconds"] - base[n]["seconds"]) / base[n]["seconds"], 2) for n in base
        },
        "seconds_per_task": round(per_task, 4),
        "noop_seconds_per_task": round(noop_s, 4),
        "ingest_validate_bytes_per_s_per_core": round(rate),
        "at_default_16MiB_partition_percent": round(100 * per_task / (DEFAULT_PARTITION / rate), 2),
        "benchmark_partition_bytes": runs[1]["ingest_partition_bytes"],
        "partition_bytes_for_5_percent": int(per_task * rate / 0.05),
    }

    memory: dict[str, Any] = {"skipped": True}
    if not args.skip_memory:
        command = [
            sys.executable,
            __file__,
            "--memory-only",
            "--memory-docs",
            str(args.memory_docs),
            "--memory-limit",
            args.memory_limit,
            "--memory-buckets",
            str(args.memory_buckets),
            "--memory-part-docs",
            str(args.memory_part_docs),
            "--check-docs",
            str(args.check_docs),
            "--memory-slice-bytes",
            str(args.memory_slice_bytes),
            "--check-slice-bytes",
            str(args.check_slice_bytes),
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode == 0:
            memory = json.loads(done.stdout.strip().splitlines()[-1])
        else:
            print(done.stdout[-3000:], done.stderr[-6000:], file=sys.stderr)
            memory = {"failed": done.stderr.strip().splitlines()[-1:], "returncode": done.returncode}

    load_after = os.getloadavg()
    print(f"load average: start {load_before}, end {load_after}, {os.cpu_count()} cpus")
    print(
        f"{'stage':<16}{'in-proc s':>10}{'1w s':>8}{'2w s':>8}{'overhead':>9}{'speedup':>9}"
        f"{'docs/s/core':>12}{'MB/s/core':>10}{'MB/s/core 2w':>13}"
    )
    for name in one:
        print(
            f"{name:<16}{base[name]['seconds']:>10.1f}{one[name]['seconds']:>8.1f}{two[name]['seconds']:>8.1f}"
            f"{overhead['per_stage_percent'][name]:>8.1f}%{one[name]['seconds'] / two[name]['seconds']:>9.2f}"
            f"{base[name]['docs_per_s_per_core']:>12.0f}{base[name]['mb_per_s_per_core']:>10.2f}"
            f"{two[name]['mb_per_s_per_core']:>13.2f}"
        )
    print(
        f"overhead (Prefect + Dask, 1 worker against the same partitions in process): "
        f"{overhead['run_percent']}% of this run, {per_task * 1000:.0f} ms per partition task "
        f"({runs[1]['partition_tasks']} tasks; a no-op task: {noop_s * 1000:.0f} ms); "
        f"{overhead['at_default_16MiB_partition_percent']}% of a 16 MiB ingest+validate partition; "
        f"under 5% from {overhead['partition_bytes_for_5_percent'] / 2**20:.1f} MiB"
    )
    peak = None
    if "workers" in memory:
        peak = max([w["peak_rss_mb"] for w in memory["workers"]] + [memory["stage_process_peak_rss_mb"]])
        print(
            f"memory bar: {memory['documents']:,} documents ({memory['in_memory_signatures_and_band_keys_mb']:.0f} MB "
            f"of signatures + band keys in memory, {memory['corpus_over_memory_limit']}x the {memory['memory_limit_mb']:.0f} MiB "
            f"worker limit) deduplicated in {memory['dedup_seconds']} s; worker peaks "
            f"{[w['peak_rss_mb'] for w in memory['workers']]} MB, stage process {memory['stage_process_peak_rss_mb']} MB; "
            f"same decisions as in memory on {memory['check']['documents']:,}: {memory['check']['identical_to_in_memory']}"
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps(
            {
                "benchmark": "scale",
                "parameters": {
                    "mb": args.mb,
                    "memory_docs": args.memory_docs,
                    "memory_limit": args.memory_limit,
                    "memory_buckets": args.memory_buckets,
                    "memory_slice_bytes": args.memory_slice_bytes,
                    "check_slice_bytes": args.check_slice_bytes,
                    "memory_part_docs": args.memory_part_docs,
                    "check_docs": args.check_docs,
                },
                "machine": {
                    "platform": platform.platform(),
                    "python": platform.python_version(),
                    "cpus": os.cpu_count(),
                    "load_average_start": load_before,
                    "load_average_end": load_after,
                },
                "runs": {str(w): r for w, r in runs.items()},
                "speedup_2_workers": round(speedup, 3),
                "overhead": overhead,
                "memory_bar": memory,
            },
            indent=2,
        )
        + "\n"
    )
    print(
        f"scale: speedup_2w={speedup:.2f} overhead={overhead['run_percent']}% "
        f"dedup_peak_rss_mb={peak if peak is not None else 'n/a'}"
    )
    return 1 if "failed" in memory else 0


if __name__ == "__main__":
    raise SystemExit(main())
