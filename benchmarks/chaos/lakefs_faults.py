"""Chaos campaign, lakeFS faults: the curate flow over the official SDK against the API double
with 0%, 5%, 20% and 50% transient faults, and with a 30 s outage in the middle of a stage.

    .venv/bin/python benchmarks/chaos/lakefs_faults.py [--rates 0,0.05,0.2,0.5] [--outage-s 30]
                                                       [--code-mb 0.4] [--prose-mb 0.3] [--work DIR]

Load: the curate flow (in this process, a Prefect API server beside it) on small demo sources,
``--repo lakefs://<name>`` over real HTTP to ``tests/lakefs_double`` (every request and answer
checked against lakeFS's OpenAPI spec). A fault rate ``r`` answers ``r/2`` of the requests with
503 and drops the connection of ``r/2`` (half before the server does the work, half after:
the response is lost, the write is done), seeded.

* One run per rate, each into a fresh lakeFS repository; the 0% run is the reference.
* Outage runs: 5% background faults, then every request answered 503 for ``--outage-s``
  seconds from the moment the shard stage has written its tokenizer (uncommitted), once with
  the default retry settings (3 stage retries, 2 s backoff doubling) and once with 5 retries.
* Checked per run: it published, with the same objects as the reference byte for byte (commit
  ids normalised to the stage that made them, as in ``curate_kills.py``), or it failed with an
  error naming the cause and ``main`` and its tags are as they were, and no run branch is left.
* Retries spent: faults injected (each one a request that had to be sent again; the outage's
  503s included), the adapter's own retries logged by this process, and Prefect task retries
  (attempts beyond the first). ``requests`` counts every request the double served during the
  run, the outage watcher's polls included.

Results: ``benchmarks/results/chaos_lakefs.json``. Last line:
``chaos_lakefs: runs=<n> identical=<k> failed_cleanly=<f> broken=<b> ...``.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from common import machine, write_results
from curate_support import content, differences, duplicated_documents, prefect_server, write_demo_config

REPOSITORY_PREFIX = "sweep"
OUTAGE_TRIGGER_STAGE = "safety"  # the run branch's head while the shard stage writes


class RetryCounter(logging.Handler):
    """Counts the lakeFS adapter's 'retry n/m' warnings in this process."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "retry" in record.getMessage():
            self.count += 1


def swap_faults(double, config, injected: Counter) -> None:
    """Change the double's faults, keeping the count of those injected so far (a swap resets it)."""
    injected.update(double.injected)
    double.faults = config


def outage_mid_shard(double, probe, outage_s: float, background, done: threading.Event, fired: list,
                     injected: Counter) -> None:  # fmt: skip
    """Answer every request with 503 for ``outage_s`` once the shard stage has written its tokenizer."""
    from flows.wap import RUN_BRANCH_PREFIX
    from tests.lakefs_double import FaultConfig
    from versioning import RepoError

    while not done.is_set():
        try:
            writing = [
                b for b, head in probe.list_branches().items()
                if b.startswith(RUN_BRANCH_PREFIX) and probe.get_commit(head).metadata.get("stage") == OUTAGE_TRIGGER_STAGE
                and probe.exists(b, "tokenizer/tokenizer.json")
            ]  # fmt: skip
        except RepoError:
            writing = []
        if writing:
            swap_faults(double, FaultConfig(error_rate=1.0), injected)
            fired.append(time.monotonic())
            done.wait(outage_s)
            swap_faults(double, background, injected)
            fired.append(time.monotonic())
            return
        done.wait(0.02)


def task_attempts(flow_run_id: Any) -> dict[str, int]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        deadline = time.monotonic() + 60
        while True:
            runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
            )
            if (runs and all(r.state and r.state.is_final() for r in runs)) or time.monotonic() > deadline:
                counts: Counter[str] = Counter()
                for r in runs:
                    counts[r.name.rsplit("-", 1)[0]] += max(0, (r.run_count or 1) - 1)
                return dict(counts)
            time.sleep(0.2)


def run_case(name: str, rate: float, outage_s: float, retries: int, config: Path, double, work: Path,
             retry_log: RetryCounter) -> dict[str, Any]:  # fmt: skip
    from flows.curate import curate
    from flows.params import CurateParams
    from flows.wap import MAIN
    from tests.lakefs_double import FaultConfig
    from versioning.lakefs import LakeFSRepo, RetryPolicy

    repository = f"{REPOSITORY_PREFIX}-{name}"
    params = CurateParams.from_toml(config)
    params.repository.spec = f"lakefs://{repository}"
    params.repository.results = str(work / "results" / name)
    params.retry.retries, params.retry.backoff_seconds = retries, 2.0
    background = FaultConfig(error_rate=rate / 2, drop_rate=rate / 2, seed=11)
    probe = LakeFSRepo.connect(
        double.endpoint, double.access_key_id, double.secret_access_key, repository,
        retry=RetryPolicy(attempts=50, base_delay_s=0.01, max_delay_s=0.5),
    )  # fmt: skip
    probe.ensure()
    main_before, tags_before = probe.resolve(MAIN), probe.list_tags()
    double.faults = background
    requests_before = sum(double.requests.values())
    retry_log.count = 0
    done, fired, injected = threading.Event(), [], Counter()
    watcher = None
    if outage_s:
        watcher = threading.Thread(
            target=outage_mid_shard, args=(double, probe, outage_s, background, done, fired, injected)
        )
        watcher.start()
    started = time.monotonic()
    try:
        state = curate(params, return_state=True)
    finally:
        done.set()
        if watcher:
            watcher.join()
    seconds = time.monotonic() - started
    swap_faults(double, FaultConfig(), injected)
    result: dict[str, Any] = {
        "case": name, "fault_rate": rate, "outage_s": outage_s, "stage_retries_allowed": retries,
        "seconds": round(seconds, 1), "requests": sum(double.requests.values()) - requests_before,
        "faults_injected": dict(injected), "adapter_retries_logged": retry_log.count,
        "task_retries": {k: v for k, v in task_attempts(state.state_details.flow_run_id).items() if v},
        "outage_fired": bool(fired),
    }  # fmt: skip
    left = sorted(set(probe.list_branches()) - {MAIN})
    if state.is_completed():
        version = state.result()
        result.update(outcome="published", tag=version.tag, commit=version.commit_id)
        result["content"] = content(probe, MAIN)
        result["duplicates"] = duplicated_documents(probe, MAIN)
    else:
        untouched = probe.resolve(MAIN) == main_before and probe.list_tags() == tags_before
        result.update(outcome="failed", error=str(state.message), main_untouched=untouched)
    result["branches_left"] = left
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", default="0,0.05,0.2,0.5")
    parser.add_argument("--outage-s", type=float, default=30.0)
    parser.add_argument("--code-mb", type=float, default=0.4)
    parser.add_argument("--prose-mb", type=float, default=0.3)
    parser.add_argument("--work", type=Path, help="work directory (default: a temporary one, removed)")
    args = parser.parse_args()
    machine_at_start = machine()
    rates = [float(r) for r in args.rates.split(",")]
    started = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory(prefix="chaos-lakefs-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        config = write_demo_config(work, args.code_mb, args.prose_mb)
        with prefect_server(work / "prefect") as env:
            os.environ.update(env)  # before Prefect is imported: it reads its settings then
            os.environ["TOKENLAKE_HOME"] = str(work / "home")
            os.environ["LAKECTL_CONFIG_FILE"] = str(work / "no-lakectl.yaml")
            from tests.lakefs_double import LakeFSDouble

            retry_log = RetryCounter()
            adapter_log = logging.getLogger("versioning.lakefs")
            adapter_log.addHandler(retry_log)
            adapter_log.propagate = False  # counted, not printed: thousands of lines at 50%
            with LakeFSDouble(work / "lakefs") as double:
                os.environ["LAKECTL_SERVER_ENDPOINT_URL"] = double.endpoint
                os.environ["LAKECTL_CREDENTIALS_ACCESS_KEY_ID"] = double.access_key_id
                os.environ["LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY"] = double.secret_access_key
                cases = [(f"faults-{int(r * 100)}pct", r, 0.0, 3) for r in rates]
                cases += [(f"outage-{args.outage_s:g}s-retries-{n}", 0.05, args.outage_s, n) for n in (3, 5)]
                for name, rate, outage_s, retries in cases:
                    result = run_case(name, rate, outage_s, retries, config, double, work, retry_log)
                    results.append(result)
                    print(f"{name}: {result['outcome']} in {result['seconds']} s, faults {result['faults_injected']}, "
                          f"adapter retries {result['adapter_retries_logged']}, task retries {result['task_retries']}"
                          + (f", error: {result.get('error')}, main untouched: {result.get('main_untouched')}"
                             if result["outcome"] == "failed" else ""), flush=True)  # fmt: skip
                violations = list(double.violations)
    reference = results[0].get("content") if results and results[0]["outcome"] == "published" else None
    identical = failed_cleanly = broken = 0
    for r in results:
        problems = []
        if r["outcome"] == "published":
            diff = differences(reference or {}, r.pop("content"))
            problems += [f"published dataset: {d}" for d in diff] + r["duplicates"]
            r["identical_to_reference"] = not diff
        elif not r["main_untouched"]:
            problems.append("failed and main or its tags changed")
        if r["branches_left"]:
            problems.append(f"branches left: {r['branches_left']}")
        r["problems"] = problems
        if problems:
            broken += 1
        elif r["outcome"] == "published":
            identical += 1
        else:
            failed_cleanly += 1
    summary = {"runs": len(results), "identical": identical, "failed_cleanly": failed_cleanly, "broken": broken,
               "spec_violations": len(violations), "seconds": round(time.monotonic() - started, 1)}  # fmt: skip
    path = write_results(
        "lakefs",
        {
            "command": f"benchmarks/chaos/lakefs_faults.py --rates {args.rates} --outage-s {args.outage_s:g} "
            f"--code-mb {args.code_mb} --prose-mb {args.prose_mb}",
            "load": {"sources": "demo sources (flows.demo_sources)", "code_mb": args.code_mb,
                     "prose_mb": args.prose_mb, "repository": "lakeFS API double over HTTP", "machine": machine_at_start},
            "summary": summary,
            "runs": results,
            "spec_violations": violations[:20],
        },
    )  # fmt: skip
    print(f"results: {path}")
    print(f"chaos_lakefs: runs={len(results)} identical={identical} failed_cleanly={failed_cleanly} "
          f"broken={broken} spec_violations={len(violations)} seconds={summary['seconds']:.0f}")  # fmt: skip
    return 0 if not broken and not violations else 1


if __name__ == "__main__":
    raise SystemExit(main())
