"""Asynchronous checkpoints through reused host buffers (the CPU path; tests/training/test_cuda.py
covers pinned buffers and the side stream)."""

from __future__ import annotations

import io

import pytest
import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
)

from training.checkpoint import CheckpointManager, load_payload, newest_valid, write_checkpoint
from training.model import GPT, GPTConfig
from training.runstate import rng_state
from training.staging import HostStaging
from training.train_state import ModelState, OptimizerState

PAYLOAD = ("model.pt", "optim.pt", "state.pt")


def trained(steps: int = 2) -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32))
    optimizer = torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-2)
    for _ in range(steps):
        train_step(model, optimizer)
    return model, optimizer


def train_step(model: GPT, optimizer: torch.optim.Optimizer) -> None:
    idx = torch.randint(0, 64, (2, 17))
    _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def live_state(model: GPT, optimizer: torch.optim.Optimizer) -> dict:
    """The trainer's payload: live model and optimizer tensors (no copies), plus run state."""
    model_state, optim_state = get_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True)
    )
    assert model_state["wte.weight"].data_ptr() == model.wte.weight.data_ptr()  # really the live tensors
    state = {"rng": [rng_state(torch.device("cpu"))], "detector": {"losses": torch.arange(3.0)}}
    return {"model.pt": model_state, "optim.pt": optim_state, "state.pt": state}


def test_a_staged_save_writes_the_same_bytes_as_a_synchronous_one(tmp_path):
    model, optimizer = trained()
    tensors, meta = live_state(model, optimizer), {"step": 2}
    tensors["module.pt"] = model.state_dict()  # an OrderedDict with _metadata: container types survive
    write_checkpoint(tmp_path / "sync", 2, tensors, {**meta, "milestone": False})
    manager = CheckpointManager(tmp_path / "staged", keep_last=2, async_save=True)
    timing = manager.save(2, tensors, meta)
    manager.wait()
    assert timing.staged_bytes > 0 and timing.waited_for_step is None
    for name in (*PAYLOAD, "module.pt", "meta.json", "COMPLETE"):
        expected = (tmp_path / "sync/step-0000002" / name).read_bytes()
        assert (tmp_path / "staged/step-0000002" / name).read_bytes() == expected, name
    # the tied output head stays one storage with the token embedding, as in the live model
    loaded = load_payload(newest_valid(tmp_path / "staged"), ("model.pt",))["model.pt"]
    assert (
        loaded["lm_head.weight"].untyped_storage().data_ptr()
        == loaded["wte.weight"].untyped_storage().data_ptr()
    )


def test_buffers_are_allocated_once_and_each_save_holds_the_state_of_its_step(tmp_path):
    model, optimizer = trained()
    manager = CheckpointManager(tmp_path, keep_last=3, async_save=True)
    pointers, expected = [], {}
    for step in (2, 3, 4):
        manager.save(step, live_state(model, optimizer), {"step": step})
        expected[step] = {k: v.clone() for k, v in model.state_dict().items()}
        pointers.append(manager.staging.buffer_pointers())
        train_step(model, optimizer)  # training mutates the live tensors while the save is written
        manager.wait()
    assert pointers[0] and pointers[0] == pointers[1] == pointers[2]
    for info in manager.directory.glob("step-*"):
        step = int(info.name.removeprefix("step-"))
        weights = torch.load(info / "model.pt", weights_only=True)
        assert all(torch.equal(weights[k], expected[step][k]) for k in expected[step])
    assert not torch.equal(expected[2]["wte.weight"], expected[4]["wte.weight"])


def test_a_save_that_must_wait_for_the_previous_write_reports_the_wait(tmp_path):
    model, optimizer = trained()
    manager = CheckpointManager(tmp_path, keep_last=3, async_save=True)
    writing = __import__("threading").Event()
    manager.save(1, live_state(model, optimizer), {"step": 1}, before_complete=writing.wait)
    wait_for_writer = manager.wait

    def release_then_wait() -> None:  # the first save is still writing when the second asks for the buffers
        writing.set()
        wait_for_writer()

    manager.wait = release_then_wait
    timing = manager.save(2, live_state(model, optimizer), {"step": 2})
    assert timing.waited_for_step == 1 and 0 < timing.waited_s <= timing.stall_s
    manager.wait = wait_for_writer
    manager.wait()
    assert manager.save(3, live_state(model, optimizer), {"step": 3}).waited_for_step is None
    manager.wait()
    assert [int(p.name[-7:]) for p in sorted(tmp_path.glob("step-*"))] == [1, 2, 3]


def test_staging_names_a_tensor_it_cannot_stage():
    staging = HostStaging(torch.device("cpu"))
    with pytest.raises(TypeError, match="model.pt/w is a Parameter"):
        staging.stage({"model.pt": {"w": torch.nn.Parameter(torch.zeros(2))}})


def test_live_state_dicts_are_get_state_dicts_own_without_its_cost():
    model, optimizer = trained()
    full = StateDictOptions(full_state_dict=True)
    pieces = (
        (ModelState(model, live=True), get_model_state_dict(model, options=full)),
        (
            OptimizerState(model, optimizer, live=True),
            get_optimizer_state_dict(model, optimizer, options=full),
        ),
    )
    model_state = pieces[0][0].state_dict()
    assert "lm_head.weight" in model_state  # the tied head too
    assert all(model_state[k].data_ptr() == v.data_ptr() for k, v in model.state_dict().items())  # no copies
    for piece, expected in pieces:
        ours, theirs = io.BytesIO(), io.BytesIO()
        torch.save(piece.state_dict(), ours)
        torch.save(expected, theirs)
        assert ours.getvalue() == theirs.getvalue()


def test_before_the_first_step_the_optimizer_state_is_created_as_get_state_dict_does():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    optim_state = OptimizerState(model, optimizer, live=True).state_dict()
    assert optim_state["state"]["wte.weight"]["step"].item() == 1.0  # the zero-learning-rate step
