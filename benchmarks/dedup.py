"""Benchmark: tokenlake's dedup against datasketch MinHash + MinHashLSH, in the same run.

Corpus: real text this machine has and that repeats a lot: the Python standard library
sources (two installed Python versions, so many files are exact or near copies), Debian
``copyright`` files and the installed packages' license and metadata files.

Both sides get the same documents, the same shingles (lowercased words, word 5-grams), the
same number of permutations and the same bands x rows; candidates are verified against the
threshold with each side's own signature estimate, clustered with the same union-find, and
the smallest document index of a cluster is kept. Documents without any word have no
shingles and are matched on exact text only, on both sides.

* ours: ``tasks.dedup.plan_dedup`` end to end (content keys, exact duplicates, vectorised
  shingles, rensa signatures, band keys, group-by, verification, union-find, survivors);
* baseline: the same shingles made in Python (regex + join), ``MinHash.bulk`` (datasketch's
  fast path), ``MinHashLSH(params=(bands, rows))`` insert and query, verification with
  ``MinHash.jaccard``, then the same union-find.

Each side runs in its own process (so each peak memory is its own: peak RSS minus the RSS
after loading the corpus), alternating ``--repeats`` times; the best run of each counts.
Speed is measured in CPU seconds of that process (user + system): the machines this runs on
are shared, and wall time there mostly measures the neighbours; both are recorded. Both
sides are single-threaded here (rensa's batch call ran on one core in our measurements; if
it ever used more, CPU seconds would count all of them, against us).
Agreement is the Jaccard similarity of the two sets of removed documents.
Results: ``benchmarks/results/dedup.json``; the last line is the summary.

    .venv/bin/python benchmarks/dedup.py [--limit-mb 20] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tasks.dedup import DedupConfig, plan_dedup  # noqa: E402
from tasks.dedup.minhash import connected_components  # noqa: E402

WORD = re.compile(rb"[0-9a-z_\x80-\xff]+")  # the word definition of tasks.dedup.shingles


def corpus_files() -> list[Path]:
    stdlib = Path(os.__file__).parent
    roots = [
        (stdlib, lambda d, f: f.endswith(".py") and "site-packages" not in d),
        (Path("/usr/lib/python3.11"), lambda d, f: f.endswith(".py") and "dist-packages" not in d),
        (Path("/usr/share/doc"), lambda d, f: f == "copyright"),
        (
            Path(sys.prefix) / "lib",
            lambda d, f: (
                (".dist-info" in d or "licenses" in d)
                and f.startswith(("LICENSE", "COPYING", "METADATA", "NOTICE", "AUTHORS"))
            ),
        ),
    ]
    files = set()
    for root, keep in roots:
        if root.is_dir():
            for directory, _, names in os.walk(root):
                files.update(Path(directory) / n for n in names if keep(directory, n))
    return sorted(files)


def load_corpus(limit_mb: float | None) -> list[str]:
    texts, total = [], 0
    for path in corpus_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        total += len(text.encode())
        if limit_mb and total >= limit_mb * 1e6:
            break
    return texts


def documents(texts: list[str]) -> pa.Table:
    ids = [f"doc-{i:07d}" for i in range(len(texts))]  # id order = index order: same survivors on both sides
    return pa.table({"id": ids, "source": ["bench"] * len(texts), "text": texts})


def run_ours(parts: list[pa.Table], config: DedupConfig) -> tuple[np.ndarray, np.ndarray, dict]:
    plan = plan_dedup(parts, config)
    cluster = np.array(plan.clusters.column("cluster").to_pylist(), object)
    label = np.unique(cluster, return_inverse=True)[1]
    return np.flatnonzero(plan.removed), label, plan.stats


def python_shingles(lowered: str, ngram: int) -> set[bytes]:
    words = WORD.findall(lowered.encode())
    if len(words) < ngram:
        return {b" ".join(words)} if words else set()
    return {b" ".join(words[i : i + ngram]) for i in range(len(words) - ngram + 1)}


def run_datasketch(texts: list[str], config: DedupConfig) -> tuple[np.ndarray, np.ndarray, dict]:
    from datasketch import MinHash, MinHashLSH

    bands, rows = config.banding
    started = time.perf_counter()
    lowered = pc.utf8_lower(pa.array(texts, pa.large_string())).to_pylist()
    shingles = [python_shingles(t, config.ngram) for t in lowered]
    with_shingles = [i for i, s in enumerate(shingles) if s]
    minhashes = MinHash.bulk(
        (list(shingles[i]) for i in with_shingles), num_perm=config.num_perm, seed=config.seed
    )
    signed = time.perf_counter()
    lsh = MinHashLSH(threshold=config.threshold, num_perm=config.num_perm, params=(bands, rows))
    with lsh.insertion_session() as session:
        for i, m in zip(with_shingles, minhashes, strict=True):
            session.insert(i, m, check_duplication=False)
    by_index = dict(zip(with_shingles, minhashes, strict=True))
    left, right = [], []
    for i, m in by_index.items():
        for j in lsh.query(m):
            if j > i and m.jaccard(by_index[j]) >= config.threshold:
                left.append(i)
                right.append(j)
    first_with_text: dict[str, int] = {}  # no shingles: exact text only
    for i, s in enumerate(shingles):
        if not s:
            j = first_with_text.setdefault(" ".join(texts[i].split()), i)
            if j != i:
                left.append(j)
                right.append(i)
    labels = connected_components(len(texts), np.array(left, np.int64), np.array(right, np.int64))
    removed = np.flatnonzero(labels != np.arange(len(texts)))
    return (
        removed,
        labels,
        {
            "seconds_shingles_and_signatures": round(signed - started, 3),
            "seconds_lsh_and_verification": round(time.perf_counter() - signed, 3),
            "verified_pairs": len(left),
        },
    )


def disputed_similarities(texts: list[str], disputed: set[int], best: dict, ngram: int) -> list[float]:
    """For each document removed by one side only: its exact Jaccard similarity to the most
    similar document that one side clustered with it and the other did not (the link in dispute)."""
    labels = {m: np.array(best[m]["labels"]) for m in best}
    lowered = pc.utf8_lower(pa.array(texts, pa.large_string()))
    shingles: dict[int, set[bytes]] = {}

    def of(i: int) -> set[bytes]:
        if i not in shingles:
            shingles[i] = python_shingles(lowered[i].as_py(), ngram)
        return shingles[i]

    similarities = []
    for doc in sorted(disputed):
        ours, theirs = (set(np.flatnonzero(label == label[doc]).tolist()) for label in labels.values())
        mates = ours ^ theirs
        similarities.append(
            round(max((len(of(doc) & of(m)) / max(len(of(doc) | of(m)), 1) for m in mates), default=0.0), 4)
        )
    return similarities


def memory_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def worker(method: str, limit_mb: float | None, config: DedupConfig, out: Path) -> None:
    texts = load_corpus(limit_mb)
    if method == "ours":  # the stage reads Arrow tables (Parquet parts); that conversion is not dedup
        table = documents(texts)
        data = [table.slice(i, 2000) for i in range(0, table.num_rows, 2000)]
    rss_before = memory_kb("VmRSS")
    started, cpu_started = time.perf_counter(), time.process_time()
    removed, labels, stats = run_ours(data, config) if method == "ours" else run_datasketch(texts, config)
    result = {
        "seconds": time.perf_counter() - started,
        "cpu_seconds": time.process_time() - cpu_started,
        "peak_memory_mb": (memory_kb("VmHWM") - rss_before) / 1024,
        "removed": removed.tolist(),
        "labels": np.asarray(labels).tolist(),
        "stats": stats,
    }
    out.write_text(json.dumps(result))


def run_worker(method: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, __file__, "--worker", method, "--out", str(out), *config_arguments(args)]
        subprocess.run(command, check=True)
        return json.loads(out.read_text())


def config_arguments(args: argparse.Namespace) -> list[str]:
    values = [
        "--num-perm",
        str(args.num_perm),
        "--threshold",
        str(args.threshold),
        "--ngram",
        str(args.ngram),
    ]
    return values + (["--limit-mb", str(args.limit_mb)] if args.limit_mb else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit-mb", type=float, default=None, help="use only the first N MB of the corpus")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each side, alternating; best counts")
    parser.add_argument("--num-perm", type=int, default=DedupConfig().num_perm)
    parser.add_argument("--threshold", type=float, default=DedupConfig().threshold)
    parser.add_argument("--ngram", type=int, default=DedupConfig().ngram)
    parser.add_argument("--worker", choices=["ours", "datasketch"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    config = DedupConfig(num_perm=args.num_perm, threshold=args.threshold, ngram=args.ngram)
    if args.worker:
        worker(args.worker, args.limit_mb, config, args.out)
        return

    texts = load_corpus(args.limit_mb)
    megabytes = sum(len(t.encode()) for t in texts) / 1e6
    runs: dict[str, list[dict]] = {"ours": [], "datasketch": []}
    for _ in range(args.repeats):
        for method in runs:
            runs[method].append(run_worker(method, args))
    best = {m: min(r, key=lambda x: x["cpu_seconds"]) for m, r in runs.items()}
    ours, baseline = set(best["ours"]["removed"]), set(best["datasketch"]["removed"])
    agreement = len(ours & baseline) / max(len(ours | baseline), 1)
    disputed = disputed_similarities(texts, ours ^ baseline, best, config.ngram)
    speed = {m: len(texts) / best[m]["cpu_seconds"] for m in runs}
    ratio = best["datasketch"]["cpu_seconds"] / best["ours"]["cpu_seconds"]
    bands, rows = config.banding
    result = {
        "documents": len(texts),
        "megabytes": round(megabytes, 3),
        "config": {
            "num_perm": config.num_perm,
            "threshold": config.threshold,
            "ngram": config.ngram,
            "bands": bands,
            "rows": rows,
        },
        "cpu_seconds": {m: [round(r["cpu_seconds"], 3) for r in rs] for m, rs in runs.items()},
        "wall_seconds": {m: [round(r["seconds"], 3) for r in rs] for m, rs in runs.items()},
        "docs_per_cpu_second": {m: round(v, 1) for m, v in speed.items()},
        "megabytes_per_cpu_second": {m: round(megabytes / best[m]["cpu_seconds"], 2) for m in runs},
        "peak_memory_mb": {m: round(best[m]["peak_memory_mb"], 1) for m in runs},
        "removed": {m: len(best[m]["removed"]) for m in runs},
        "removed_by_both": len(ours & baseline),
        "disputed_true_jaccard": disputed,
        "agreement": round(agreement, 4),
        "speed_ratio": round(ratio, 2),
        "stats": {m: best[m]["stats"] for m in runs},
    }
    results_dir = ROOT / "benchmarks" / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "dedup.json").write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"corpus: {len(texts)} documents, {megabytes:.1f} MB; {config.num_perm} permutations, "
        f"{bands} bands x {rows} rows, threshold {config.threshold}, word {config.ngram}-grams"
    )
    for m in runs:
        print(
            f"  {m:10s} best {best[m]['cpu_seconds']:7.2f} CPU s of {result['cpu_seconds'][m]} "
            f"(wall {result['wall_seconds'][m]})  {speed[m]:8.1f} docs/s  "
            f"{result['megabytes_per_cpu_second'][m]:6.2f} MB/s  "
            f"peak +{result['peak_memory_mb'][m]:.0f} MB  removed {result['removed'][m]}"
        )
    print(
        f"  removed by both: {len(ours & baseline)}; only ours: {len(ours - baseline)}; "
        f"only datasketch: {len(baseline - ours)}"
    )
    if disputed:
        print(
            f"  disputed documents: true Jaccard of the link in dispute "
            f"{min(disputed):.3f} .. {max(disputed):.3f}"
        )
    print(f"dedup: docs/s={speed['ours']:.0f} vs_datasketch={ratio:.1f}x agreement={agreement:.3f}")


if __name__ == "__main__":
    main()
