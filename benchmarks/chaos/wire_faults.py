"""Chaos campaign, faults on the wire: the curate flow on a real lakeFS v1.84.0 (MinIO behind it)
with toxiproxy in front of lakeFS and between lakeFS and MinIO, every fault for several rounds.

    .venv/bin/python benchmarks/chaos/wire_faults.py [--rounds 3] [--faults NAME,...] [--work DIR]

Faults (``tests/reliability/wire_support.py``): latency 200 ± 100 ms; connection resets on 5% and
20% of connections; a 256 KB/s bandwidth cap; 200 ± 100 ms between lakeFS and S3; a 30 s outage
after the ingest commit and once the publish takes its lock; lakeFS SIGKILLed and restarted at
the same two moments. Each run goes into a fresh repository, on the demo-size test corpus, in this
process with a Prefect API server beside it. An outcome is acceptable when the run published
content byte-identical to the fault-free reference run's, or failed with one sentence naming
lakeFS, ``main`` untouched, and the re-run published the identical content; the adapter's retries
are counted. Results: ``benchmarks/results/chaos_wire.json``. Last line:
``chaos_wire: runs=<n> acceptable=<k> published=<p> failed_cleanly=<f> retries=<r>``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from common import machine, write_results
from curate_support import prefect_server

from tests.flows.curate_support import write_corpus
from tests.reliability.wire_support import FAULTS, Wire, reference_run, run_under_fault


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--faults", default=",".join(FAULTS), help=f"comma-separated, of: {', '.join(FAULTS)}"
    )
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        parser.error(f"unknown fault {unknown[0]!r}: choose from {', '.join(FAULTS)}")
    work = args.work or Path(tempfile.mkdtemp(prefix="tokenlake-chaos-wire-"))
    started = machine()
    with prefect_server(work / "prefect") as env:
        os.environ.update(env)
        wire = Wire(work / "wire")
        try:
            os.environ.update(wire.stack.lakectl_environment())
            os.environ["LAKECTL_CONFIG_FILE"] = str(work / "no-lakectl.yaml")
            os.environ["TOKENLAKE_HOME"] = str(work / "home")
            corpus = write_corpus(work / "corpus")
            reference = reference_run(wire, corpus, work / "reference")
            outcomes = []
            for round_ in range(args.rounds):
                for fault in faults:
                    outcome = run_under_fault(wire, corpus, work / f"{fault}-{round_}", reference, fault)
                    outcomes.append(outcome)
                    verdict = "ok" if outcome.acceptable else "NOT ACCEPTABLE"
                    print(
                        f"round {round_ + 1} {fault}: {outcome.state}, {outcome.retries} retries, {verdict}",
                        flush=True,
                    )
        finally:
            wire.stop()
    published = sum(o.state == "Completed" for o in outcomes)
    summary = {
        "runs": len(outcomes),
        "acceptable": sum(o.acceptable for o in outcomes),
        "published": published,
        "failed_cleanly": sum(o.acceptable and o.state != "Completed" for o in outcomes),
        "retries": sum(o.retries for o in outcomes),
    }
    path = write_results("wire", {"machine": started, "rounds": args.rounds, "summary": summary,
                                  "runs": [asdict(o) | {"acceptable": o.acceptable} for o in outcomes]})  # fmt: skip
    print(f"results: {path}")
    print("chaos_wire: " + " ".join(f"{k}={v}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
