"""Real torchrun jobs (2 processes): exact resume after SIGKILL, elastic resume, FSDP2.

Each rank needs a CUDA device of its own; on a machine with fewer (one GPU, say) the jobs
run on the CPU with gloo instead, and a warning in the test summary says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.training.helpers import (
    ROOT,
    device_for_ranks,
    final_weights,
    make_dataset,
    newest_durable_step,
    torchrun,
    torchrun_command,
    torchrun_killed_after,
    train_records,
)
from tests.training.helpers import make_config as make_job_config
from training.config import CheckpointConfig, FaultConfig, OptimConfig
from training.metrics import read_metrics

pytestmark = pytest.mark.slow
DEVICE, FALLBACK = device_for_ranks(2)


def make_config(ds, run, **fields):
    # on CUDA, NCCL and cuBLAS need deterministic kernels for the bit-for-bit comparisons
    return make_job_config(ds, run, device=DEVICE, deterministic=DEVICE != "cpu", **fields)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    if FALLBACK:
        warnings.warn(f"tests/training/test_distributed.py: {FALLBACK}", stacklevel=1)
    return make_dataset(tmp_path_factory.mktemp("distributed"))


@pytest.fixture(scope="module")
def baseline(dataset):
    """An uninterrupted 2-process run of 16 steps: the reference for every other run here."""
    config = make_config(
        dataset, "baseline", log_samples=True, checkpoint=CheckpointConfig(every=4, milestone_every=4)
    )
    result = torchrun(config, 2)
    assert result.returncode == 0, result.stderr[-4000:]
    return config


def resumes(config) -> list[tuple[int, int]]:
    return [
        (r["step"], r["world_size"])
        for r in read_metrics(config.run_dir() / "metrics.jsonl")
        if r["kind"] == "resume"
    ]


def test_sigkill_inside_a_step_during_a_save_and_from_outside_resumes_bit_for_bit(dataset, baseline):
    config = make_config(
        dataset, "killed", faults=FaultConfig(kill_at_steps=(6,), kill_in_save_at_steps=(8,))
    )
    # Each resume must start from the newest checkpoint that was durable when the job died;
    # which one that is can depend on the machine's speed, so it is read off the disk.
    durable = []
    # 1: rank 0 SIGKILLs every rank inside step 6, between the backward and the optimizer step
    # (the injected kill first lets the step-4 save in flight finish)
    assert torchrun(config, 2).returncode != 0
    durable.append(newest_durable_step(config))
    # 2: killed while the step-8 checkpoint is being written, before its COMPLETE marker
    assert torchrun(config, 2).returncode != 0
    assert (config.run_dir() / "faults/killed-save-8").exists()
    durable.append(newest_durable_step(config))
    # 3: killed from outside once step 10 is logged and a new step-8 checkpoint is durable
    assert torchrun_killed_after(config, 2, step=10, durable=8) != 0
    durable.append(newest_durable_step(config))
    # 4: resumes from the newest complete checkpoint and finishes
    result = torchrun(config, 2)
    assert result.returncode == 0, result.stderr[-4000:]

    assert durable[:2] == [4, 4] and durable[2] in (8, 12)
    assert [step for step, _ in resumes(config)] == [0, *durable]
    expected = {r["step"]: r["loss"] for r in train_records(baseline.run_dir())}
    seen = train_records(config.run_dir())
    assert {r["step"] for r in seen} == set(expected)
    assert len(seen) > len(expected)  # steps after each checkpoint were replayed ...
    assert all(r["loss"] == expected[r["step"]] for r in seen)  # ... and every replay matched exactly

    reference, resumed = final_weights(baseline.run_dir(), 16), final_weights(config.run_dir(), 16)
    assert reference.keys() == resumed.keys()
    assert all(torch.equal(reference[k], resumed[k]) for k in reference)
    optim_ref, optim_resumed = (
        torch.load(run / "checkpoints/step-0000016/optim.pt", weights_only=True)
        for run in (baseline.run_dir(), config.run_dir())
    )
    for param, state in optim_ref["state"].items():
        assert all(torch.equal(value, optim_resumed["state"][param][key]) for key, value in state.items())
    assert not list((config.run_dir() / "checkpoints").glob(".tmp-*"))


def global_order(run_dir, world_size: int, accumulation: int) -> dict[int, list[str]]:
    """Samples of each step in global chunk order (chunk a*world + rank), the last log of a step winning."""
    by_rank = []
    for rank in range(world_size):
        steps = {}
        for line in (run_dir / f"samples-rank{rank}-of-{world_size}.jsonl").read_text().splitlines():
            entry = json.loads(line)
            steps[entry["step"]] = np.array_split(entry["samples"], accumulation)
        by_rank.append(steps)
    return {
        step: [s for a in range(accumulation) for rank in range(world_size) for s in by_rank[rank][step][a]]
        for step in by_rank[0]
    }


def test_resume_on_one_process_sees_the_same_samples_in_the_same_order(dataset, baseline):
    config = make_config(dataset, "elastic", log_samples=True)
    shutil.copytree(  # the checkpoint of step 8 that the two-process baseline wrote
        baseline.run_dir() / "checkpoints/step-0000008", config.run_dir() / "checkpoints/step-0000008"
    )
    result = torchrun(config, 1)  # the same global batch of 8: one process accumulates 4 micro-batches
    assert result.returncode == 0, result.stderr[-4000:]
    assert resumes(config) == [(8, 1)]

    reference = global_order(baseline.run_dir(), world_size=2, accumulation=2)
    on_one = global_order(config.run_dir(), world_size=1, accumulation=4)
    assert sorted(on_one) == list(range(9, 17))
    for step, samples in on_one.items():
        assert samples == reference[step], f"step {step}"
    # the same samples and weights: the losses agree up to the order of floating-point sums
    expected = {r["step"]: r["loss"] for r in train_records(baseline.run_dir())}
    for r in train_records(config.run_dir()):
        assert r["loss"] == pytest.approx(expected[r["step"]], rel=1e-4)


def test_fsdp2_trains_on_cpu_and_resumes_exactly(dataset, baseline):
    config = make_config(
        dataset, "fsdp", parallel="fsdp", steps=8, optim=OptimConfig(lr=1e-2, min_lr=1e-3, warmup_steps=2, decay_steps=16),
        faults=FaultConfig(kill_at_steps=(6,)),
    )  # fmt: skip
    assert torchrun(config, 2).returncode != 0
    result = torchrun(config, 2)
    assert result.returncode == 0, result.stderr[-4000:]
    records = train_records(config.run_dir())
    first = {}
    for r in records:  # step 5 ran twice: before the kill and after the resume from step 4
        assert r["loss"] == first.setdefault(r["step"], r["loss"])
    assert [r["step"] for r in records].count(5) == 2
    expected = {r["step"]: r["loss"] for r in train_records(baseline.run_dir())}
    for step, loss in first.items():  # sharded gradients reduce in another order than DDP's
        assert loss == pytest.approx(expected[step], rel=1e-4)
    weights = final_weights(config.run_dir(), 8)  # a full (unsharded) state dict, like DDP's
    assert weights.keys() == final_weights(baseline.run_dir(), 16).keys()


def test_no_ddp_wrapper_outlives_the_process_group(dataset, tmp_path):
    # found by benchmarks/chaos/train_kills.py: a rank hung at exit when the DDP reducer was the
    # process group's last owner (its destructor waited, under the GIL, on a gloo thread
    # that needed the GIL)
    config = make_config(dataset, "teardown", steps=2, eval_every=0)
    command = torchrun_command(config, 2)
    command[command.index("training")] = "tests.training.teardown_probe"
    probe = tmp_path / "probe"
    result = subprocess.run(
        command, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1", "TEARDOWN_PROBE": str(probe)},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert [Path(f"{probe}.rank{r}").read_text() for r in (0, 1)] == ["0", "0"]
