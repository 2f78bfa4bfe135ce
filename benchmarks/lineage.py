"""Lineage queries over a run with 1,000 checkpoints, against listing the records (the floor).

One repository per backend (the local adapter; ``LakeFSRepo`` over the lakeFS API double,
request validation off) holding two published versions and, on branch ``runs``, a run of
``--checkpoints`` checkpoint records on v1 (the trainer's format) plus a run of 100 on v2.
Measured, best of ``--rounds``:

* ``list runs/`` (baseline): one listing of every record path, reading none;
* ``read every record, one by one``: what a plain loop over the listing costs;
* ``checkpoints on v1``: :func:`flows.lineage.checkpoints_on` (``tokenlake lineage TAG``):
  one listing, every record read in parallel;
* ``lineage of big@500``: :func:`flows.lineage.checkpoint_lineage` (``tokenlake lineage RUN@STEP``):
  the run's listing, one record, the publish and its stage commits;
* ``samples of step 100``: :func:`flows.step_samples.step_positions` (``--step``): the listing,
  the two records around the step, mix and manifest.

Then ``main`` is rolled back to v1 (the rollback flow's steps, its record and marks on ``runs``),
so every verdict has a rollback to judge against (``formats/rollbacks.py``):

* ``checkpoints on v2, rolled back``: ``tokenlake lineage TAG`` on the reverted version, each
  checkpoint judged;
* ``check data before training``: :func:`training.reverted.check_training_data`, what the
  train flow and the trainer do at start (here refusing v2).

    .venv/bin/python benchmarks/lineage.py [--checkpoints 1000] [--rounds 3]

Results go to benchmarks/results/lineage.json. Last line:
``lineage: lakefs-double checkpoints-on=<s> (x<ratio> of listing) ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.lineage import checkpoint_lineage, checkpoints_on, find_checkpoint, read_lineage  # noqa: E402
from flows.restore import plan_rollback, restore_main  # noqa: E402
from flows.step_samples import step_positions  # noqa: E402
from flows.taint import find_tainted, mark_tainted, rollback_record  # noqa: E402
from tests.flows.lineage_support import (  # noqa: E402
    BAD_SOURCES,
    GOOD_SOURCES,
    publish_version,
    write_checkpoint_records,
)
from training.lineage import LINEAGE_BRANCH  # noqa: E402
from training.reverted import RevertedDataRefused, check_training_data  # noqa: E402
from versioning import DataRepo  # noqa: E402
from versioning.local import LocalRepo  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


@contextmanager
def local_repo(work: Path) -> Iterator[DataRepo]:
    repo = LocalRepo(work / "local", durable=False)
    repo.ensure()
    yield repo


@contextmanager
def double_repo(work: Path) -> Iterator[DataRepo]:
    from tests.lakefs_double import LakeFSDouble
    from versioning.lakefs import LakeFSRepo

    with LakeFSDouble(work / "lakefs-double", validate=False) as double:
        repo = LakeFSRepo.connect(double.endpoint, double.access_key_id, double.secret_access_key, "lineage")
        repo.ensure()
        yield repo


def best(rounds: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(repo: DataRepo, checkpoints: int, rounds: int) -> dict[str, float]:
    v1 = publish_version(repo, "bench-1", GOOD_SOURCES, seed=1)
    v2 = publish_version(repo, "bench-2", BAD_SOURCES, seed=2)
    write_checkpoint_records(repo, "big", v1.commit_id, list(range(1, checkpoints + 1)))
    write_checkpoint_records(repo, "other", v2.commit_id, list(range(1, 101)))
    head = repo.resolve(LINEAGE_BRANCH)
    config = {"global_batch": 8, "data": {"heldout_fraction": 0.05}}
    last = find_checkpoint(repo, f"big@{checkpoints}")
    last.record["config"] = config  # as if the record carried its config (these runs have no files)

    def one_by_one() -> None:
        for stat in repo.list(head, "runs/"):
            json.loads(repo.get(head, stat.path))

    found = checkpoints_on(repo, v1.tag)
    assert len(found) == checkpoints, f"expected {checkpoints} checkpoints on v1, found {len(found)}"
    times = {
        "list runs/": best(rounds, lambda: list(repo.list(head, "runs/"))),
        "read every record, one by one": best(rounds, one_by_one),
        "checkpoints on v1": best(rounds, lambda: checkpoints_on(repo, v1.tag)),
        "lineage of big@500": best(rounds, lambda: checkpoint_lineage(repo, "big@500")),
        "samples of step 100": best(rounds, lambda: step_positions(repo, last, 100)),
    }
    plan = plan_rollback(repo, v1.tag)
    rollback = rollback_record(repo, plan, restore_main(repo, plan, "bench-rollback"), "bench-rollback")
    mark_tainted(repo, find_tainted(repo, read_lineage(repo), rollback), rollback, "bench-rollback")
    on_v2 = checkpoints_on(repo, v2.tag)
    assert len(on_v2) == 100 and all(c.tainted for c in on_v2), "every checkpoint on v2 is tainted"

    def refused() -> None:
        try:
            check_training_data(repo, v2.commit_id, allow_reverted=False)
        except RevertedDataRefused:
            return
        raise AssertionError("training on v2 was not refused")

    times["checkpoints on v2, rolled back"] = best(rounds, lambda: checkpoints_on(repo, v2.tag))
    times["check data before training"] = best(rounds, refused)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoints", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    load_start = os.getloadavg()[0]
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-lineage-") as tmp:
        for name, factory in (("local", local_repo), ("lakefs-double", double_repo)):
            with factory(Path(tmp) / name) as repo:
                results[name] = measure(repo, args.checkpoints, args.rounds)
    rows = []
    for backend, times in results.items():
        floor = times["list runs/"]
        for case, seconds in times.items():
            rows.append({"backend": backend, "case": case, "seconds": round(seconds, 4),
                         "x listing": round(seconds / floor, 2)})  # fmt: skip
    width = max(len(r["case"]) for r in rows)
    print(f"{'backend':14}  {'case':{width}}  {'seconds':>8}  {'x listing':>9}")
    for r in rows:
        print(f"{r['backend']:14}  {r['case']:{width}}  {r['seconds']:8.3f}  {r['x listing']:9.2f}")
    (RESULTS / "lineage.json").write_text(json.dumps({
        "checkpoints": args.checkpoints, "rounds": args.rounds, "machine": platform.machine(),
        "cpus": os.cpu_count(), "load_start": load_start, "load_end": os.getloadavg()[0], "rows": rows,
    }, indent=2) + "\n")  # fmt: skip
    remote = results["lakefs-double"]
    print(
        f"lineage: lakefs-double checkpoints-on={remote['checkpoints on v1']:.2f}s "
        f"(x{remote['checkpoints on v1'] / remote['list runs/']:.1f} of listing), "
        f"checkpoint={remote['lineage of big@500']:.2f}s, step={remote['samples of step 100']:.2f}s, "
        f"one-by-one={remote['read every record, one by one']:.2f}s, "
        f"rolled-back-version={remote['checkpoints on v2, rolled back']:.2f}s, "
        f"check-before-training={remote['check data before training']:.2f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
