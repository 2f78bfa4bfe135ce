"""What Prefect orchestration costs: the curate flow against the same stage functions called directly.

Both sides curate the same input (this machine's demo sources: standard-library code, package
metadata and licenses; see ``flows/demo_sources.py``) into a fresh local repository and publish
it: the direct side calls ``run_ingest``, ``run_validate``, ``run_dedup``, ``run_shard`` and
``run_mix`` (through ``tasks.stage.run_stage``) on a branch, then merges into main and tags; the flow
side runs ``flows.curate.curate`` (task runs, cache keys and persisted results, reuse
decisions, artifacts, the publish lock) against an already-running ephemeral Prefect API, so
the API server's start is not counted. On this noisy shared machine the rounds alternate which
side goes first, and the best of each side is compared (medians are printed too); the first
round also pays one-time imports for both sides.

    .venv/bin/python benchmarks/orchestration.py [--code-mb 16] [--prose-mb 4] [--rounds 3]

Last line: ``orchestration: flow/direct=<ratio>``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_HOME", str(ROOT / ".prefect" / "benchmark"))
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from prefect import flow  # noqa: E402

from flows.curate import curate  # noqa: E402
from flows.demo_sources import MB, DemoBudget, demo_sources  # noqa: E402
from flows.params import CurateParams, GateConfig, RepositoryConfig  # noqa: E402
from flows.wap import MAIN, next_tag  # noqa: E402
from tasks.dedup.stage import run_dedup  # noqa: E402
from tasks.ingest.config import IngestConfig  # noqa: E402
from tasks.ingest.stage import run_ingest  # noqa: E402
from tasks.mix.stage import run_mix  # noqa: E402
from tasks.shard.stage import run_shard  # noqa: E402
from tasks.stage import run_stage  # noqa: E402
from tasks.validate.stage import run_validate  # noqa: E402
from versioning.local import LocalRepo  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def direct(params: CurateParams, repo_dir: Path) -> dict[str, float]:
    """The five stage functions in a row on one branch, then merge and tag: no Prefect."""
    started = time.perf_counter()
    repo = LocalRepo(repo_dir)
    repo.ensure()
    commit = repo.create_branch("direct", MAIN)
    seconds = {}
    for stage, run, config in [
        ("ingest", run_ingest, params.ingest),
        ("validate", run_validate, params.validation),
        ("dedup", run_dedup, params.dedup),
        ("shard", run_shard, params.shards),
        ("mix", run_mix, params.mix),
    ]:
        t = time.perf_counter()
        commit = run_stage(run, repo, "direct", commit, config).commit_id
        seconds[stage] = time.perf_counter() - t
    repo.create_tag(next_tag(repo), repo.merge(commit, MAIN, "publish"))
    seconds["total"] = time.perf_counter() - started
    return seconds


def orchestrated(params: CurateParams) -> dict[str, float]:
    started = time.perf_counter()
    version = curate(params)
    assert version.new, "the flow side must do the work, not reuse it"
    return {"total": time.perf_counter() - started}


@flow(name="benchmark-warm-up")
def _warm_up() -> None:
    """Starts the ephemeral API before anything is timed."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--code-mb", type=float, default=16.0)
    parser.add_argument("--prose-mb", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tokenlake-orchestration-"))
    os.environ["TOKENLAKE_HOME"] = str(work / "home")
    try:
        budget = DemoBudget(
            int(args.code_mb * MB), int(args.prose_mb * MB * 2 / 3), int(args.prose_mb * MB / 3)
        )
        sources = demo_sources(work / "sources", budget)
        params = CurateParams(
            ingest=IngestConfig(sources=sources),
            gates=GateConfig(min_documents=1, min_tokens=1, max_quarantined_fraction=1.0),
        )
        _warm_up()
        directs: list[dict[str, float]] = []
        flows: list[dict[str, float]] = []
        for n in range(args.rounds):
            run_params = params.model_copy(
                update={
                    "repository": RepositoryConfig(
                        spec=str(work / f"flow-{n}"), results=str(work / f"results-{n}")
                    )
                }
            )
            if n % 2:
                flows.append(orchestrated(run_params))
                directs.append(direct(params, work / f"direct-{n}"))
            else:
                directs.append(direct(params, work / f"direct-{n}"))
                flows.append(orchestrated(run_params))
            d, f = directs[-1], flows[-1]
            print(
                f"round {n + 1}: direct {d['total']:.2f} s "
                f"({', '.join(f'{k} {v:.2f}' for k, v in d.items() if k != 'total')}), flow {f['total']:.2f} s"
            )
        best_direct = min(directs, key=lambda r: r["total"])
        best_flow = min(flows, key=lambda r: r["total"])
        ratio = best_flow["total"] / best_direct["total"]
        median_ratio = statistics.median(f["total"] for f in flows) / statistics.median(
            d["total"] for d in directs
        )
        input_mb = sum(p.stat().st_size for s in sources for p in Path(s.path).rglob("*") if p.is_file()) / MB
        result = {
            "input_mb": round(input_mb, 2),
            "sources": [s.name for s in sources],
            "rounds": args.rounds,
            "direct_seconds": round(best_direct["total"], 3),
            "direct_stage_seconds": {k: round(v, 3) for k, v in best_direct.items() if k != "total"},
            "flow_seconds": round(best_flow["total"], 3),
            "flow_over_direct": round(ratio, 4),
            "flow_over_direct_medians": round(median_ratio, 4),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        }
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "orchestration.json").write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        print(f"orchestration: flow/direct={ratio:.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
