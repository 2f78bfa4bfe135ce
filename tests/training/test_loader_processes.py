"""Loader processes with a warm shadow: a failed loader never stops training (issue 19, item 2)."""

from __future__ import annotations

import json
import os

import pytest

from tests.training.helpers import make_config, make_dataset, torchrun, train_records
from training.config import DataConfig, FaultConfig
from training.metrics import read_metrics
from training.trainer import train

KILLS = tuple(range(2, 42, 2))  # 20 kills, every second batch
STEPS = 44


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("loaders"))


def records(run_dir, kind):
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == kind]


@pytest.mark.slow
def test_sigkill_of_the_active_loader_20_times_on_two_ranks_never_restarts_and_changes_no_loss(dataset):
    uninterrupted = make_config(dataset, "loader-calm", steps=STEPS)
    killed = make_config(
        dataset, "loader-killed", steps=STEPS, faults=FaultConfig(kill_loader_at_batches=KILLS)
    )
    for config in (uninterrupted, killed):
        result = torchrun(config, nproc=2)
        assert result.returncode == 0, result.stderr[-3000:]

    calm, chaos = train_records(uninterrupted.run_dir()), train_records(killed.run_dir())
    assert [r["loss"] for r in chaos] == [r["loss"] for r in calm]  # bit for bit, every step
    assert len(records(killed.run_dir(), "resume")) == 1, "the trainer restarted"
    assert [r["steps_in_process"] for r in chaos] == list(range(1, STEPS + 1))
    takeovers = records(killed.run_dir(), "loader_takeover")
    faults = records(killed.run_dir(), "loader_fault")
    assert [f["batch"] for f in faults] == list(KILLS) and len({f["pid"] for f in faults}) == len(KILLS)
    for fault in faults:  # each killed loader was replaced by the shadow, named by its pid
        (takeover,) = [t for t in takeovers if f"(pid {fault['pid']})" in t["reason"]]
        assert "killed by signal 9" in takeover["reason"] and takeover["from_shadow"], takeover
    assert len(takeovers) == len(KILLS), "a loader was taken over that was not killed"
    summary = records(killed.run_dir(), "data")[-1]
    assert summary["takeovers"] == summary["shadow_takeovers"] == len(KILLS)
    # step 1 waits for the loader processes to start; every later wait is the kills' doing
    stall = max(r["data_wait_ms"] for r in chaos[1:])
    calm_stall = max(r["data_wait_ms"] for r in calm[1:])
    print(
        f"\n{len(KILLS)} loader kills on 2 ranks ({summary['warm_takeovers']} found the shadow warm): longest "
        f"step stall (data wait after step 1) {stall:.1f} ms, {calm_stall:.1f} ms without kills; supervisor "
        f"takeover time median {sorted(t['takeover_ms'] for t in takeovers)[len(takeovers) // 2]:.1f} ms"
    )
    status = json.loads((killed.run_dir() / "loaders" / "node-0.json").read_text())
    assert status["takeovers"] == len(KILLS)


def test_a_loader_that_stops_answering_is_killed_and_its_shadow_takes_over(dataset, tmp_path):
    data = dict(heldout_fraction=0.05, eval_sequences=16, prefetch_batches=2)
    reference = make_config(
        dataset, "stop-ref", home=str(tmp_path / "ref"), data=DataConfig(loader="thread", **data)
    )
    stopped = make_config(
        dataset, "stopped", home=str(tmp_path / "stopped"), faults=FaultConfig(stop_loader_at_batches=(3,)),
        data=DataConfig(loader_timeout_s=1.0, **data),
    )  # fmt: skip
    train(reference)
    status_file = stopped.run_dir() / "loaders" / "node-0.json"
    train(stopped)

    assert [r["loss"] for r in train_records(stopped.run_dir())] == [
        r["loss"] for r in train_records(reference.run_dir())
    ]  # and the process loader hands out exactly the thread loader's batches
    takeovers = records(stopped.run_dir(), "loader_takeover")
    (fault,) = records(stopped.run_dir(), "loader_fault")
    stopped_pid = fault["pid"]
    # found by its pid: on a loaded machine a 1 s heartbeat gap may also retire another loader
    (takeover,) = [t for t in takeovers if f"(pid {stopped_pid})" in t["reason"]]
    assert "stopped answering" in takeover["reason"] and takeover["from_shadow"], takeover
    with pytest.raises(ProcessLookupError):
        os.kill(stopped_pid, 0)  # killed, not left stopped
    assert json.loads(status_file.read_text())["takeovers"] == len(takeovers)
