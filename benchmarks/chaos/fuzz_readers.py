"""Chaos campaign, readers: the ingest property tests with many random examples.

    .venv/bin/python benchmarks/chaos/fuzz_readers.py [--examples 5000]

Runs ``tests/tasks/test_ingest_fuzz.py`` (arbitrary bytes as files, with gzip/zstd/BOM
wrappers and other encodings; random, broken, re-encoded and oversized JSONL lines, plain,
compressed and cut short, over small byte-range partitions; Parquet files with random
columns, types, null patterns and row groups) with ``--examples`` random examples per
property instead of the CI suite's 40 fixed ones. A crash or a broken count is a failing
example, which hypothesis shrinks and prints.

Results: ``benchmarks/results/chaos_fuzz.json``. Last line:
``chaos_fuzz: properties=<n> examples=<e> failing=<f> crashes=<c> seconds=<s>``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

from common import ROOT, machine, write_results

TEST_FILE = "tests/tasks/test_ingest_fuzz.py"
_STATS_TEST = re.compile(r"^(tests/\S+::\S+):$")
_STATS_COUNTS = re.compile(r"(\d+) passing, (\d+) failing, and (\d+) invalid")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--examples", type=int, default=5000, help="random examples per property")
    args = parser.parse_args()
    machine_at_start = machine()
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--hypothesis-show-statistics", TEST_FILE],
        cwd=ROOT, env={**os.environ, "TOKENLAKE_FUZZ_EXAMPLES": str(args.examples)},
        capture_output=True, text=True,
    )  # fmt: skip
    seconds = time.monotonic() - started
    properties: dict[str, dict[str, int]] = {}
    current = None
    for line in out.stdout.splitlines():
        if match := _STATS_TEST.match(line.strip()):
            current = match.group(1).split("::")[1]
        elif current and (counts := _STATS_COUNTS.search(line)):
            stats = properties.setdefault(current, {"passing": 0, "failing": 0, "invalid": 0})
            for key, value in zip(("passing", "failing", "invalid"), counts.groups(), strict=True):
                stats[key] += int(value)
    failed_tests = [line.split(" ", 1)[1] for line in out.stdout.splitlines() if line.startswith("FAILED ")]
    examples = sum(p["passing"] + p["failing"] for p in properties.values())
    failing = sum(p["failing"] for p in properties.values())
    crashes = [line for line in out.stdout.splitlines() if line.startswith("E ") and "Error" in line][:20]
    path = write_results(
        "fuzz",
        {
            "command": f"benchmarks/chaos/fuzz_readers.py --examples {args.examples}",
            "load": {"properties": TEST_FILE, "examples_per_property": args.examples, "machine": machine_at_start},
            "summary": {"properties": len(properties), "examples": examples, "failing_examples": failing,
                        "failed_properties": failed_tests, "seconds": round(seconds, 1), "pytest_rc": out.returncode},
            "properties": properties,
            "errors": crashes,
            "tail": out.stdout[-4000:] if out.returncode else "",
        },
    )  # fmt: skip
    print(f"results: {path}")
    print(f"chaos_fuzz: properties={len(properties)} examples={examples} failing={failing} "
          f"failed_properties={len(failed_tests)} seconds={seconds:.0f}")  # fmt: skip
    return 0 if out.returncode == 0 and properties else 1


if __name__ == "__main__":
    raise SystemExit(main())
