"""A dedup worker that holds a spill folder open and is killed there (tests/tasks/test_dedup_leftovers.py).

    python -m tests.tasks.dedup_scratch_worker REPO KIND

KIND ``dedup-slices``: a bucket step reading its inputs in slices; ``dedup-out``: a step writing
more output than it holds. Once its folder exists, the worker prints the folder's path and
waits for a signal.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa

from tasks.dedup import DedupConfig
from tasks.dedup.shuffle.scratch import KEY, BucketWriter, ShuffleRun, SlicedInput, slice_of_content
from versioning.local import LocalRepo
from versioning.scratch import HOST

ROWS = pa.schema([("content_key", KEY), ("value", pa.int64())])


def bucket_rows(n: int) -> pa.Table:
    keys = [hashlib.sha256(f"{i}".encode()).digest()[:16] for i in range(n)]
    return pa.table({"content_key": pa.array(keys, KEY), "value": pa.array(np.arange(n))})


def shuffle_run(repo: LocalRepo) -> ShuffleRun:
    """1 KiB slices: a few kilobytes of rows make every step spill."""
    config = DedupConfig(buckets=4, slice_bytes=1 << 10)
    return ShuffleRun(repo, "main", repo.resolve("main"), config, "_scratch/dedup", "index/run", ())


def _held(kind: str) -> None:
    (folder,) = Path(tempfile.gettempdir()).glob(f"tokenlake-{kind}-{HOST}-{os.getpid()}-*")
    print(folder, flush=True)
    signal.pause()


def main(repo_dir: str, kind: str) -> None:
    run = shuffle_run(LocalRepo(Path(repo_dir)))
    if kind == "dedup-slices":
        for _ in run.in_slices([SlicedInput(run.at("rows", 0), ROWS, slice_of_content("content_key"))]):
            _held(kind)
    else:
        table = bucket_rows(400)
        with BucketWriter(run, "out", "p0") as writer:
            writer.write(table, np.zeros(table.num_rows, np.int64))
            _held(kind)


if __name__ == "__main__":
    main(*sys.argv[1:])
