"""Training on a CUDA device: exact resume in bf16, pinned checkpoint staging, FSDP2 on one GPU,
the micro-batch chosen from memory, the chunked loss's memory. Skipped without CUDA; run on a
GPU machine by ``benchmarks/gpu_check.sh``."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from tests.training.helpers import (
    Dataset,
    final_weights,
    make_config,
    make_dataset,
    newest_durable_step,
    torchrun,
    train_records,
)
from training.checkpoint import CheckpointManager, write_checkpoint
from training.config import FaultConfig, ModelConfig, PerfConfig
from training.losses import chunked_cross_entropy
from training.metrics import read_metrics
from training.model import GPT, GPTConfig
from training.synthetic import publish_synthetic_dataset
from training.trainer import train
from versioning.local import LocalRepo

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (run benchmarks/gpu_check.sh on a GPU machine)"
)
CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("cuda"))


def bf16(ds, run, **fields):
    """A tiny run in bf16 autocast with deterministic kernels (cuBLAS, flash attention's backward)."""
    return make_config(ds, run, dtype="bfloat16", deterministic=True, **fields)


def assert_replays_match(reference, run, steps: int) -> None:
    expected = {r["step"]: r["loss"] for r in train_records(reference.run_dir())}
    seen = train_records(run.run_dir())
    assert {r["step"] for r in seen} == set(expected)
    assert all(r["loss"] == expected[r["step"]] for r in seen)
    weights, other = final_weights(reference.run_dir(), steps), final_weights(run.run_dir(), steps)
    assert all(torch.equal(weights[k], other[k]) for k in weights)


def test_a_bf16_run_killed_inside_a_step_resumes_bit_for_bit(dataset):
    baseline = bf16(dataset, "cuda-baseline")
    result = torchrun(baseline, 1)
    assert result.returncode == 0, result.stderr[-4000:]
    killed = bf16(dataset, "cuda-killed", faults=FaultConfig(kill_at_steps=(6,)))
    assert torchrun(killed, 1).returncode != 0  # SIGKILL between step 6's backward and its update
    assert newest_durable_step(killed) == 4
    result = torchrun(killed, 1)
    assert result.returncode == 0, result.stderr[-4000:]
    assert len(train_records(killed.run_dir())) > len(train_records(baseline.run_dir()))  # 5 was replayed
    assert_replays_match(baseline, killed, 16)
    # judging every 4 steps (no host sync inside a step) trains the same run
    lagged = bf16(dataset, "cuda-lagged", perf=PerfConfig(sync_every=4))
    result = torchrun(lagged, 1)
    assert result.returncode == 0, result.stderr[-4000:]
    assert_replays_match(baseline, lagged, 16)


def mid_model():
    """About 17M parameters: a staging copy of ~200 MB takes milliseconds, far longer than
    launching an optimizer step, so an unfenced step would overwrite what is being copied."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=8192, block_size=64, n_layer=4, n_head=8, n_embd=512)).to(CUDA)
    return model, torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-2, fused=True)


def backward(model) -> None:
    idx = torch.randint(0, 8192, (8, 65), device=CUDA)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()


def update(optimizer) -> None:
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def live_state(model, optimizer) -> dict:
    model_state, optim_state = get_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True)
    )
    return {"model.pt": model_state, "optim.pt": optim_state}


def test_pinned_staging_writes_the_synchronous_bytes_and_never_a_later_step(tmp_path):
    model, optimizer = mid_model()
    manager = CheckpointManager(tmp_path / "staged", keep_last=5, device=CUDA)
    optimizer.register_step_pre_hook(lambda *_: manager.fence())  # as the trainer does
    pointers = []
    for step in (1, 2):
        backward(model)
        update(optimizer)
        backward(model)  # the next step's gradients are ready before the save ...
        snapshot_model, snapshot_optimizer = copy.deepcopy((model, optimizer))  # the state being saved
        timing = manager.save(step, live_state(model, optimizer), {"step": step})
        update(optimizer)  # ... so its update is launched at once: the fence must hold it back
        manager.wait()
        assert timing.staged_bytes > 100 * 2**20 and manager.staging.buffers_pinned()
        pointers.append(manager.staging.buffer_pointers())

        # the synchronous path: the same state moved to the CPU, written on this thread
        snapshot_model.cpu()
        for state in snapshot_optimizer.state.values():
            for key, value in state.items():
                state[key] = value.cpu()
        sync_state = live_state(snapshot_model, snapshot_optimizer)
        sync = write_checkpoint(tmp_path / "sync", step, sync_state, {"step": step, "milestone": False})
        for name in ("model.pt", "optim.pt", "COMPLETE"):
            assert (tmp_path / f"staged/step-{step:07d}" / name).read_bytes() == (sync / name).read_bytes(), (
                name
            )
    assert pointers[0] == pointers[1]  # the buffers were allocated once


def test_fsdp2_on_one_gpu_trains_and_resumes(dataset):
    reference = bf16(dataset, "cuda-fsdp-reference", steps=8)
    assert torchrun(reference, 1).returncode == 0
    config = bf16(dataset, "cuda-fsdp", steps=8, parallel="fsdp", faults=FaultConfig(kill_at_steps=(6,)))
    assert torchrun(config, 1).returncode != 0
    result = torchrun(config, 1)
    assert result.returncode == 0, result.stderr[-4000:]
    records = train_records(config.run_dir())
    first = {}
    for r in records:  # step 5 ran twice: before the kill and after the resume from step 4
        assert r["loss"] == first.setdefault(r["step"], r["loss"])
    assert [r["step"] for r in records].count(5) == 2
    expected = {r["step"]: r["loss"] for r in train_records(reference.run_dir())}
    for step, loss in first.items():  # sharded on one rank: the same sums, kernels may differ
        assert loss == pytest.approx(expected[step], rel=1e-3)
    assert final_weights(config.run_dir(), 8).keys() == final_weights(reference.run_dir(), 8).keys()


def test_the_micro_batch_chosen_from_memory_keeps_training_within_the_budget(tmp_path):
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    commit = publish_synthetic_dataset(
        repo, "main", {"web": 300, "code": 300}, seq_len=1024, vocab_size=50257, total_samples=600
    )
    config = make_config(
        Dataset(tmp_path, tmp_path / "repo", commit),
        "auto-micro-batch",
        steps=2,
        global_batch=256,
        micro_batch=1,
        model=ModelConfig.preset("gpt2-124m"),
        eval_every=0,
        perf=PerfConfig(auto_micro_batch=True, memory_headroom=0.5),
    )
    train(config)
    records = read_metrics(config.run_dir() / "metrics.jsonl")
    chosen = next(r for r in records if r["kind"] == "resume")["micro_batch"]
    budget_mb = 0.5 * torch.cuda.get_device_properties(CUDA).total_memory / 2**20
    assert 1 < chosen < 256 and 256 % chosen == 0  # limited by memory, not by the batch
    assert max(r["peak_memory_mb"] for r in records if r["kind"] == "train") <= budget_mb


def test_the_chunked_loss_never_holds_the_full_fp32_logits():
    tokens, width, vocab = 8192, 768, 50304
    generator = torch.Generator(device=CUDA).manual_seed(0)
    hidden = torch.randn(tokens, width, device=CUDA, generator=generator, requires_grad=True)
    weight = (0.02 * torch.randn(vocab, width, device=CUDA, generator=generator)).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), device=CUDA, generator=generator)
    full_fp32_logits = tokens * vocab * 4

    def peak_above_start(loss_fn) -> tuple[float, int]:
        hidden.grad = weight.grad = None
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn()
        loss.backward()
        torch.cuda.synchronize()
        return loss.item(), torch.cuda.max_memory_allocated() - start

    plain, plain_peak = peak_above_start(
        lambda: torch.nn.functional.cross_entropy((hidden @ weight.t()).float(), targets)
    )
    chunked, chunked_peak = peak_above_start(lambda: chunked_cross_entropy(hidden, weight, targets, 1024))
    assert plain_peak > full_fp32_logits > chunked_peak
    assert chunked == pytest.approx(plain, rel=1e-2)


@pytest.mark.skipif(torch.cuda.device_count() > 1, reason="needs fewer CUDA devices than local ranks")
def test_more_local_ranks_than_gpus_is_refused_in_one_sentence(monkeypatch):
    from training.distributed import init_distributed

    ranks = torch.cuda.device_count() + 1
    for name, value in {
        "RANK": ranks - 1,
        "WORLD_SIZE": ranks,
        "LOCAL_RANK": ranks - 1,
        "LOCAL_WORLD_SIZE": ranks,
    }.items():
        monkeypatch.setenv(name, str(value))
    with pytest.raises(
        RuntimeError, match=f"has {ranks - 1} CUDA device\\(s\\): start at most {ranks - 1} process"
    ):
        init_distributed()
