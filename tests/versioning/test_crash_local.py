"""Crash safety of the local adapter: SIGKILL a writer at random points, then check.

A worker process (tests/versioning/crash_workers.py) puts bytes, paths and streams
(small and multi-chunk), commits, merges, tags, deletes and resets in a seeded random
loop until it is killed. After every kill the repository must open, every branch and
tag must point at a complete commit whose objects all exist with the right sha256,
nothing partial may be visible through the port, and writing again must succeed.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.versioning.crash_workers import ConsistencyCheck
from versioning.local import LocalRepo

TRIALS = 24
SEED = 20240611
WORKERS = "tests.versioning.crash_workers"


@pytest.mark.slow
def test_sigkill_at_random_points_leaves_the_repository_consistent(tmp_path: Path, repo_root: Path):
    rng = random.Random(SEED)
    root = tmp_path / "repo"
    check = ConsistencyCheck()
    operations = 0
    for trial in range(TRIALS):
        seed = rng.randrange(2**32)
        context = f"trial {trial}, worker seed {seed}"
        process = subprocess.Popen(
            [sys.executable, "-m", WORKERS, "crash", str(root), str(seed)],
            cwd=repo_root,
            stdout=subprocess.PIPE,
        )
        assert process.stdout is not None
        assert process.stdout.readline() == b"ready\n", context
        time.sleep(rng.uniform(0.0, 0.4))
        process.send_signal(signal.SIGKILL)
        process.wait()
        operations += len(process.stdout.read().split())
        process.stdout.close()
        assert process.returncode == -signal.SIGKILL, f"{context}: the worker stopped before the kill"

        with LocalRepo(root) as repo:
            check(repo)
            repo.ensure()  # sweeps the dead worker's temp files
            assert list((root / "objects" / "tmp").iterdir()) == [], context
            data = rng.randbytes(3 << 20)
            repo.put("main", f"rerun/{trial}.bin", data)
            repo.commit("main", f"rerun {trial}")
            repo.create_branch(f"rerun-{trial}", "main")
            repo.put(f"rerun-{trial}", f"rerun/{trial}.txt", b"merged after a crash")
            repo.commit(f"rerun-{trial}", "rerun change")
            repo.merge(f"rerun-{trial}", "main")
            assert repo.get("main", f"rerun/{trial}.bin") == data, context
            check(repo)
    assert operations >= TRIALS, "the workers completed too few operations for the kills to mean anything"
    assert len(check.objects) > TRIALS
