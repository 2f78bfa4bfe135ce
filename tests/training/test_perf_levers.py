"""The speed levers of TrainConfig.perf change how fast a run goes, not what it computes."""

from __future__ import annotations

import pytest
import torch

from tests.training.helpers import (
    Dataset,
    final_weights,
    make_config,
    make_dataset,
    newest_durable_step,
    torchrun,
    train_records,
)
from tests.training.test_runs import windows
from training.config import CheckpointConfig, FaultConfig, PerfConfig
from training.metrics import read_metrics
from training.trainer import train

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Dataset:
    return make_dataset(tmp_path_factory.mktemp("levers"))


def events(config) -> list[tuple]:
    return [
        (r["at_step"], r["to_step"], r["window_start"], r["window_end"], r["reason"])
        for r in read_metrics(config.run_dir() / "metrics.jsonl")
        if r["kind"] == "rollback"
    ]


def assert_same_run(expected, got, steps: int) -> None:
    """Bit-equal losses of every step, rollbacks, final weights and optimizer state."""
    reference = {r["step"]: r["loss"] for r in train_records(expected.run_dir())}
    seen = train_records(got.run_dir())
    assert {r["step"] for r in seen} == set(reference)
    assert all(r["loss"] == reference[r["step"]] for r in seen)
    assert events(got) == events(expected)
    weights, other = final_weights(expected.run_dir(), steps), final_weights(got.run_dir(), steps)
    assert weights.keys() == other.keys() and all(torch.equal(weights[k], other[k]) for k in weights)
    optim, other_optim = (
        torch.load(c.run_dir() / f"checkpoints/step-{steps:07d}/optim.pt", weights_only=True)
        for c in (expected, got)
    )
    for param, state in optim["state"].items():
        assert all(torch.equal(v, other_optim["state"][param][k]) for k, v in state.items())


def test_judging_every_few_steps_gives_the_same_losses_rollbacks_and_weights(dataset, tmp_path):
    spike_window = windows(dataset, tmp_path, 10, [])[9]  # step 10's samples
    nan_window = windows(dataset, tmp_path, 14, [spike_window])[13]
    faults = FaultConfig(spike_at_positions=(spike_window[0] + 1,), nan_at_positions=(nan_window[0],))
    checkpoint = CheckpointConfig(every=4, milestone_every=4)
    at_once = make_config(dataset, "judged-at-once", faults=faults, checkpoint=checkpoint)
    train(at_once)
    assert [e[:2] for e in events(at_once)] == [(10, 8), (14, 12)]
    # 5 does not divide the checkpoint interval: windows also end at every checkpoint and evaluation
    lagged = at_once.model_copy(update={"run": "judged-every-5", "perf": PerfConfig(sync_every=5)})
    train(lagged)
    assert_same_run(at_once, lagged, 16)


def test_a_lagged_run_killed_inside_a_step_and_during_a_save_resumes_bit_for_bit(dataset):
    baseline = make_config(dataset, "lag-baseline")
    assert torchrun(baseline, 1).returncode == 0
    killed = make_config(
        dataset,
        "lag-killed",
        perf=PerfConfig(sync_every=3),
        faults=FaultConfig(kill_at_steps=(6,), kill_in_save_at_steps=(12,)),
    )
    assert torchrun(killed, 1).returncode != 0
    assert newest_durable_step(killed) == 4  # step 5 was applied but never judged, so never saved
    assert torchrun(killed, 1).returncode != 0
    assert newest_durable_step(killed) == 8
    result = torchrun(killed, 1)
    assert result.returncode == 0, result.stderr[-4000:]
    assert_same_run(baseline, killed, 16)


def test_checkpoint_records_carry_the_stall_the_wait_and_the_staged_bytes(dataset):
    config = make_config(dataset, "timed", steps=8, perf=PerfConfig(sync_every=4, auto_micro_batch=True))
    train(config)
    saved = [r for r in train_records(config.run_dir()) if "ckpt_stall_ms" in r]
    assert [r["step"] for r in saved] == [4, 8]
    assert all(r["ckpt_staged_mb"] > 0 and 0 <= r["ckpt_wait_ms"] <= r["ckpt_stall_ms"] for r in saved)
    records = read_metrics(config.run_dir() / "metrics.jsonl")
    resume = next(r for r in records if r["kind"] == "resume")
    assert resume["micro_batch"] == config.micro_batch  # the probe needs CUDA: the configured one is kept
    drain = [r for r in records if r["kind"] == "checkpoint_drain"]
    assert len(drain) == 1 and drain[0]["ms"] >= 0
