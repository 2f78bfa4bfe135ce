"""A whole-job SIGKILL leaves the node's loader ring in /dev/shm, and its commit file: no process
of the job runs its cleanup. The janitor reports them, and the next start of training on this
host removes them (their owner is dead), never a live job's ring."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from flows.janitor import sweep_scratch
from tests.training.helpers import (
    ROOT,
    _env,
    children,
    make_config,
    make_dataset,
    torchrun,
    torchrun_command,
    train_records,
)
from training.loader_ring import RING_KIND, shm_dir
from versioning.liveness import pid_alive
from versioning.scratch import HOST, owned_prefix


def rings() -> set[str]:
    return {p.name for p in shm_dir().glob(f"tokenlake-{RING_KIND}-{HOST}-*")}


def process_tree(pid: int) -> list[int]:
    tree = [pid]
    for child in children(pid):
        tree += process_tree(child)
    return tree


def kill_whole_job_after(config, step: int) -> None:
    """torchrun, its worker and the worker's loader processes (torchrun starts its workers in
    their own sessions), all SIGKILLed once ``step`` is logged; returns when all are dead."""
    job = subprocess.Popen(
        torchrun_command(config, nproc=1), cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    metrics = config.run_dir() / "metrics.jsonl"
    while not (metrics.exists() and any(r["step"] >= step for r in train_records(config.run_dir()))):
        assert job.poll() is None, f"the job ended ({job.returncode}) before step {step}"
        time.sleep(0.05)
    tree = process_tree(job.pid)
    assert len(tree) >= 4, f"torchrun, its worker and two loader processes: {tree}"
    for pid in tree:
        os.kill(pid, signal.SIGKILL)
    job.wait()
    while any(pid_alive(pid) for pid in tree):  # the others are reaped by init
        time.sleep(0.05)


def test_a_sigkilled_jobs_loader_ring_is_reported_then_removed_by_the_next_start(tmp_path):
    dataset = make_dataset(tmp_path / "data")
    config = make_config(dataset, "ring-left", steps=12)
    assert config.data.loader == "process"
    before = rings()
    kill_whole_job_after(config, step=2)
    left = rings() - before
    assert len(left) == 2 and any(name.endswith(".commit.json") for name in left), left

    live = shm_dir() / f"{owned_prefix(RING_KIND)}node0-test"  # a live job's ring: never touched
    live.write_bytes(b"\0" * 64)
    try:
        reported = {v.path: v for v in sweep_scratch(dry_run=True)}
        for name in left:
            verdict = reported[str(shm_dir() / name)]
            assert verdict.kind == RING_KIND and not verdict.removed and verdict.bytes > 0
        assert str(live) not in reported
        assert left <= rings(), "a dry run removes nothing"

        restarted = torchrun(config, nproc=1)
        assert restarted.returncode == 0, restarted.stderr[-3000:]
        assert not left & rings(), "the next start removes the dead job's ring and commit file"
        assert "left by pid" in restarted.stdout
        assert [r["step"] for r in train_records(config.run_dir())][-1] == 12
        assert live.exists()
    finally:
        live.unlink()
