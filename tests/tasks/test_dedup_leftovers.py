"""A SIGKILLed dedup worker leaves its spill folder (``tokenlake-dedup-slices-*`` while it reads a
bucket in slices, ``tokenlake-dedup-out-*`` while it writes a step's output); the janitor reports
it, and the next dedup step of this host that spills removes it, never a live worker's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from flows.janitor import sweep_scratch
from tasks.dedup.shuffle.scratch import BucketWriter, SlicedInput, slice_of_content
from tests.tasks.dedup_scratch_worker import ROWS, bucket_rows, shuffle_run
from versioning.local import LocalRepo
from versioning.scratch import owned_prefix

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A temp folder of this test's own, for this process and the worker (others' leftovers stay out)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def kill_worker_holding(kind: str, repo_dir: Path) -> tuple[Path, int]:
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.tasks.dedup_scratch_worker", str(repo_dir), kind],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        held = worker.stdout.readline().strip()  # printed once its folder exists
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        worker.stdout.close()
    assert held, f"the worker ended ({worker.returncode}) before holding its folder"
    return Path(held), worker.pid


@pytest.mark.parametrize("kind", ["dedup-slices", "dedup-out"])
def test_a_killed_workers_spill_folder_is_reported_then_removed_by_the_next_spill(kind, scratch, tmp_path):
    repo_dir = tmp_path / "repo"
    repo = LocalRepo(repo_dir)
    repo.ensure()
    run = shuffle_run(repo)
    for producer in range(3):
        run.put(run.at("rows", 0, f"p{producer}"), bucket_rows(400))

    left, pid = kill_worker_holding(kind, repo_dir)
    assert left.is_dir() and any(left.iterdir()), "the kill left the spilled rows"
    live = tempfile.TemporaryDirectory(prefix=owned_prefix(kind))  # a live worker's: never touched

    reported = [v for v in sweep_scratch(dry_run=True) if v.path == str(left)]
    assert [(v.kind, v.pid, v.removed) for v in reported] == [(kind, pid, False)]
    assert reported[0].bytes > 0 and left.is_dir()

    if kind == "dedup-slices":  # the same step again, on this host
        read = [
            t
            for _, _, (t,) in run.in_slices(
                [SlicedInput(run.at("rows", 0), ROWS, slice_of_content("content_key"))]
            )
        ]
        assert sum(t.num_rows for t in read) == 1200
    else:
        with BucketWriter(run, "out", "p0") as writer:
            writer.write(bucket_rows(400), np.zeros(400, np.int64))
        assert run.read(run.at("out", 0), ROWS).num_rows == 400
    assert not left.exists(), "the next spill of this kind removes what the dead worker left"
    assert Path(live.name).is_dir()
    assert list(scratch.iterdir()) == [Path(live.name)], "the step's own folder went with it"
    live.cleanup()
    repo.close()
