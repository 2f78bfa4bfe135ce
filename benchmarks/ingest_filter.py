"""Benchmark: ingest + quality filters, in documents per second per core, against a baseline
that only reads and writes the same documents with pyarrow, in the same run.

Corpus: real text this machine has. Code: the Python standard library's ``.py`` files (a
``files`` source). Prose: the installed packages' metadata descriptions, written once to a
JSONL file before timing (a ``jsonl`` source).

* ours: ``plan_partitions`` + ``ingest_partition`` (read, decode, normalise, quarantine) then
  ``apply_filters`` with the default ValidateConfig (Gopher/C4 prose rules, code rules,
  language id on prose), every output (kept and quarantined) written as Parquet;
* baseline: the same files read with ``open().read()`` and the JSONL with
  ``pyarrow.json.read_json``, the texts written as Parquet with ``pyarrow.parquet``.

Both sides run in this process, single-threaded (pyarrow's CPU pool is set to one thread),
alternating ``--repeats`` times after a warm-up that loads the language model; the best run
of each counts. Speed is in CPU seconds of the process (user + system), since these
machines are shared and wall time mostly measures the neighbours; both are recorded.
``vs_pyarrow_copy`` is ours / baseline in documents per CPU second (1.0 would be as fast as
a bare copy). The repository and the Great Expectations gate are not in the timed path
(the stage adds them once per run, not per document); ``--stage`` also times the full
stages on a LocalRepo once, for the record.

    .venv/bin/python benchmarks/ingest_filter.py [--repeats 3] [--stage]

Results: ``benchmarks/results/ingest_filter.json``; the last line is the summary.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import sysconfig
import tempfile
import time
from collections import Counter
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tasks.ingest import IngestConfig, SourceConfig, ingest_partition, plan_partitions  # noqa: E402
from tasks.ingest.partitions import list_source_files  # noqa: E402
from tasks.parts import iter_batches  # noqa: E402
from tasks.validate import ValidateConfig, apply_filters  # noqa: E402

EXCLUDED = ["site-packages/*", "dist-packages/*", "*/__pycache__/*", "__pycache__/*"]


def write_prose_jsonl(path: Path) -> int:
    """Every installed distribution's long description, one JSON line each."""
    count = 0
    with open(path, "wb") as f:
        for dist in importlib.metadata.distributions():
            metadata = dist.metadata
            body = metadata.get_payload() if metadata is not None else None
            if isinstance(body, str) and body.strip():
                f.write(orjson.dumps({"name": metadata["Name"], "text": body}) + b"\n")
                count += 1
    return count


def sources(prose_jsonl: Path) -> list[SourceConfig]:
    return [
        SourceConfig(
            name="stdlib",
            kind="code",
            format="files",
            path=sysconfig.get_paths()["stdlib"],
            include=["*.py"],
            exclude=EXCLUDED,
        ),
        SourceConfig(name="package-docs", kind="prose", format="jsonl", path=str(prose_jsonl)),
    ]


def ours(config: IngestConfig, filters: ValidateConfig, out: Path) -> dict[str, int]:
    counts: Counter = Counter()
    for source in config.sources:
        for partition in plan_partitions(source, config):
            kept, quarantined = ingest_partition(source, partition, config)
            counts["documents_in"] += kept.num_rows + quarantined.num_rows
            counts["ingest_quarantined"] += quarantined.num_rows
            pq.write_table(quarantined, out / f"q-ingest-{source.name}-{partition.index}.parquet")
            for i, batch in enumerate(iter_batches([kept], filters.batch_rows)):
                passed, rejected, _ = apply_filters(batch, source.name, source.kind, filters)
                counts["kept"] += passed.num_rows
                counts["filter_quarantined"] += rejected.num_rows
                pq.write_table(passed, out / f"filtered-{source.name}-{partition.index}-{i}.parquet")
                pq.write_table(rejected, out / f"q-validate-{source.name}-{partition.index}-{i}.parquet")
    return dict(counts)


def baseline(config: IngestConfig, out: Path) -> dict[str, int]:
    documents = 0
    for source in config.sources:
        if source.format == "files":
            texts, paths = [], []
            for path, rel in list_source_files(source):
                with open(path, "rb") as f:
                    texts.append(f.read())
                paths.append(rel)
            table = pa.table({"locator": paths, "text": pa.array(texts, pa.binary())})
        else:
            table = pajson.read_json(source.path)
        pq.write_table(table, out / f"copy-{source.name}.parquet")
        documents += table.num_rows
    return {"documents_in": documents}


def timed(run, *args) -> tuple[dict[str, int], float, float]:
    with tempfile.TemporaryDirectory() as out:
        cpu, wall = time.process_time(), time.perf_counter()
        counts = run(*args, Path(out))
        return counts, time.process_time() - cpu, time.perf_counter() - wall


def stage_once(config: IngestConfig, filters: ValidateConfig) -> dict[str, float]:
    """The full stages (LocalRepo, gates, Data Docs) once, for the record."""
    from tasks.ingest import run_ingest
    from tasks.stage import run_stage
    from tasks.validate.stage import run_validate
    from versioning import open_repo

    with tempfile.TemporaryDirectory() as root:
        repo = open_repo(str(Path(root) / "repo"))
        cpu, wall = time.process_time(), time.perf_counter()
        ingested = run_stage(run_ingest, repo, "main", repo.resolve("main"), config)
        validated = run_stage(run_validate, repo, "main", ingested.commit_id, filters)
        return {
            "cpu_seconds": time.process_time() - cpu,
            "wall_seconds": time.perf_counter() - wall,
            "documents_in": ingested.report["documents_in"],
            "kept": validated.report["kept"],
            "gates": f"{ingested.report['expectations']['summary']}; {validated.report['expectations']['summary']}",
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stage", action="store_true", help="also time the full stages on a LocalRepo once")
    args = parser.parse_args()
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)

    with tempfile.TemporaryDirectory() as work:
        prose = Path(work) / "package-docs.jsonl"
        prose_docs = write_prose_jsonl(prose)
        config = IngestConfig(sources=sources(prose))
        filters = ValidateConfig()
        timed(ours, config, filters)  # warm-up: page cache, language model, imports
        runs: dict[str, list[tuple[float, float]]] = {"ours": [], "baseline": []}
        for _ in range(args.repeats):
            ours_counts, cpu, wall = timed(ours, config, filters)
            runs["ours"].append((cpu, wall))
            base_counts, cpu, wall = timed(baseline, config)
            runs["baseline"].append((cpu, wall))
        stage = stage_once(config, filters) if args.stage else None

    documents = ours_counts["documents_in"]
    assert documents == base_counts["documents_in"], (ours_counts, base_counts)
    assert (
        documents
        == ours_counts["kept"] + ours_counts["ingest_quarantined"] + ours_counts["filter_quarantined"]
    )
    ours_cpu, ours_wall = min(runs["ours"])
    base_cpu, base_wall = min(runs["baseline"])
    docs_per_core = documents / ours_cpu
    ratio = docs_per_core / (documents / base_cpu)
    result = {
        "benchmark": "ingest_filter",
        "corpus": {
            "documents": documents,
            "code_files": documents - prose_docs,
            "prose_documents": prose_docs,
            "bytes": sum(os.path.getsize(p) for p, _ in list_source_files(config.sources[0])),
        },
        "counts": ours_counts,
        "ours": {"cpu_seconds": ours_cpu, "wall_seconds": ours_wall, "docs_per_cpu_second": docs_per_core},
        "baseline_pyarrow_copy": {
            "cpu_seconds": base_cpu,
            "wall_seconds": base_wall,
            "docs_per_cpu_second": documents / base_cpu,
        },
        "vs_pyarrow_copy": ratio,
        "runs": runs,
        "target_docs_per_core": 1000,
        "nemo_curator_ci_floor_docs_per_core": 150,
        "full_stage_once": stage,
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "pyarrow": pa.__version__},
    }
    out = ROOT / "benchmarks" / "results" / "ingest_filter.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps(
            {k: result[k] for k in ("corpus", "counts", "ours", "baseline_pyarrow_copy", "full_stage_once")},
            indent=2,
        )
    )
    print(f"ingest_filter: docs/s/core={docs_per_core:.0f} vs_pyarrow_copy={ratio:.3f}")


if __name__ == "__main__":
    main()
