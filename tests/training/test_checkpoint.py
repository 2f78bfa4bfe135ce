"""Checkpoint files: atomic writes, verification, safe loading, pruning, asynchronous saves."""

from __future__ import annotations

import argparse
import json
import os
import shutil

import pytest
import torch

from training.checkpoint import (
    CheckpointError,
    CheckpointManager,
    list_checkpoints,
    load_payload,
    newest_valid,
    remove_partial_saves,
    verify_checkpoint,
    write_checkpoint,
)


def payload(step: int) -> dict:
    return {"model.pt": {"w": torch.full((4, 4), float(step))}, "state.pt": {"step": torch.tensor(step)}}


def test_a_save_interrupted_before_complete_is_never_taken_for_a_checkpoint(tmp_path):
    write_checkpoint(tmp_path, 1, payload(1), {"step": 1})

    def crash():
        raise KeyboardInterrupt  # stands in for a kill between the payload and COMPLETE

    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(tmp_path, 2, payload(2), {"step": 2}, before_complete=crash)
    assert [c.step for c in list_checkpoints(tmp_path)] == [1]
    assert newest_valid(tmp_path).step == 1
    leftovers = remove_partial_saves(tmp_path)
    assert [p.name for p in leftovers] == [f".tmp-step-0000002-{os.getpid()}"]


def test_corruption_is_detected_and_the_previous_checkpoint_is_used(tmp_path):
    for step in (1, 2, 3):
        write_checkpoint(tmp_path, step, payload(step), {"step": step})
    (tmp_path / "step-0000003/model.pt").write_bytes(b"garbage")  # wrong size
    second = tmp_path / "step-0000002/state.pt"
    data = bytearray(second.read_bytes())
    data[-30] ^= 1  # same size, different bytes
    second.write_bytes(bytes(data))
    warnings = []
    found = newest_valid(tmp_path, warn=warnings.append)
    assert found.step == 1
    assert "bytes" in warnings[0] and "sha256" in warnings[1]
    loaded = load_payload(found, ("model.pt",))
    assert torch.equal(loaded["model.pt"]["w"], torch.full((4, 4), 1.0))


def test_loading_refuses_anything_but_plain_tensors_and_containers(tmp_path):
    write_checkpoint(tmp_path, 1, {"model.pt": argparse.Namespace(a=1)}, {"step": 1})  # a pickled class
    info = verify_checkpoint(tmp_path / "step-0000001")  # digests are fine ...
    with pytest.raises(CheckpointError, match="weights_only"):  # ... but it is not weights-only
        load_payload(info, ("model.pt",))


def test_prune_keeps_the_last_k_and_every_milestone(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2, milestone_every=4, async_save=False)
    for step in range(1, 11):
        manager.save(step, payload(step), {"step": step})
    assert [c.step for c in list_checkpoints(tmp_path)] == [4, 8, 9, 10]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"step-{s:07d}" for s in (4, 8, 9, 10)]


def test_a_prune_killed_half_way_leaves_no_checkpoint_with_files_missing(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path, keep_last=1, async_save=False)
    manager.save(1, payload(1), {"step": 1})

    rmtree = shutil.rmtree

    def killed_after_one_file(path, ignore_errors=False):
        if not path.name.startswith(".trash-"):  # not the prune's delete
            return rmtree(path, ignore_errors=ignore_errors)
        (path / "COMPLETE").unlink()  # COMPLETE went first ...
        raise KeyboardInterrupt  # ... then the process died

    monkeypatch.setattr("training.checkpoint.shutil.rmtree", killed_after_one_file)
    with pytest.raises(KeyboardInterrupt):
        manager.save(2, payload(2), {"step": 2})
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("step-")] == ["step-0000002"]
    assert [p.name for p in remove_partial_saves(tmp_path)] == [f".trash-step-0000001-{os.getpid()}"]
    assert newest_valid(tmp_path).step == 2


def test_an_asynchronous_save_snapshots_the_state_when_called(tmp_path):
    saved = []
    manager = CheckpointManager(tmp_path, keep_last=3, async_save=True, on_saved=saved.append)
    weights = torch.zeros(1000)
    manager.save(1, {"model.pt": {"w": weights}}, {"step": 1})
    weights += 1  # training goes on mutating the parameters while the save runs
    manager.wait()
    info = newest_valid(tmp_path)
    assert torch.equal(load_payload(info, ("model.pt",))["model.pt"]["w"], torch.zeros(1000))
    assert [s.step for s in saved] == [1]
    assert json.loads((info.path / "COMPLETE").read_text())["files"]["model.pt"]["bytes"] > 4000


def test_a_failed_background_save_is_raised_on_the_training_thread(tmp_path):
    manager = CheckpointManager(tmp_path / "file", keep_last=1, async_save=True)
    (tmp_path / "file").write_text("not a directory")
    manager.save(1, payload(1), {"step": 1})
    with pytest.raises(CheckpointError, match="background checkpoint save failed"):
        manager.wait()
