"""Whole training runs in this process (one rank): data binding, fallback, rollback, bad shards."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.training.helpers import Dataset, final_weights, make_config, make_dataset, train_records, windows
from training.checkpoint import list_checkpoints
from training.config import CheckpointConfig, FaultConfig
from training.data import DataError
from training.errors import TrainingError
from training.metrics import read_metrics
from training.resume import DataChangeRefused
from training.synthetic import publish_synthetic_dataset
from training.trainer import train
from versioning.local import LocalRepo

pytestmark = pytest.mark.slow


@pytest.fixture
def dataset(tmp_path) -> Dataset:
    return make_dataset(tmp_path)


def lineage(ds: Dataset, path: str) -> dict:
    return json.loads(LocalRepo(ds.repo).get("runs", path))


def test_a_run_writes_checkpoints_metrics_plot_and_lineage(dataset):
    result = train(make_config(dataset, "plain", steps=8, report=True))
    run = result.run_dir
    assert result.step == 8 and result.tokens == 8 * 8 * 32
    assert [c.step for c in list_checkpoints(run / "checkpoints")] == [0, 4, 8]
    assert (run / "loss.png").stat().st_size > 0 and "| final_loss |" in (run / "summary.md").read_text()
    records = train_records(run)
    assert [r["step"] for r in records] == list(range(1, 9))
    assert records[-1]["loss"] < records[0]["loss"]
    assert {"tokens_per_s", "step_ms", "data_wait_share", "flops_per_s", "peak_memory_mb"} <= records[
        -1
    ].keys()
    assert [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "eval"]  # held-out loss at step 8
    record = lineage(dataset, "runs/plain/checkpoints/step-0000008.json")
    assert record["data"]["commit"] == dataset.commit
    assert record["tokens"] == result.tokens and record["checkpoint"].endswith("step-0000008")
    assert not list((run / "lineage-queue").glob("*.json"))


def test_a_lineage_record_lost_to_a_kill_after_the_checkpoint_is_written_again_on_restart(dataset):
    # found by benchmarks/chaos/train_kills.py: a SIGKILL after the final checkpoint's COMPLETE and
    # before its record was queued left that checkpoint without lineage for good
    config = make_config(dataset, "lost-record", steps=4)
    train(config)
    repo = LocalRepo(dataset.repo)
    path = "runs/lost-record/checkpoints/step-0000004.json"
    written = repo.get("runs", path)
    repo.delete("runs", path)
    repo.commit("runs", "the record as if it had never been queued", {})
    train(config)  # resumes at the last step: nothing to train, a checkpoint to account for
    assert repo.get("runs", path) == written


def test_a_restart_leaves_a_checkpoint_record_already_written_as_it_is(dataset):
    # the rollback's fork writes the record of the checkpoint it hard-links into a new run (that
    # run's name, forked_from); the checkpoint's own meta.json still names the old run
    config = make_config(dataset, "forked", steps=4)
    train(config)
    repo = LocalRepo(dataset.repo)
    path = "runs/forked/checkpoints/step-0000004.json"
    forked = {**json.loads(repo.get("runs", path)), "forked_from": {"from_run": "elsewhere", "from_step": 4}}
    written = (json.dumps(forked, indent=2, sort_keys=True) + "\n").encode()
    repo.put("runs", path, written)
    repo.commit("runs", "the fork's record of the checkpoint", {})
    train(config)  # resumes at the last step and queues that checkpoint's record again, if absent
    assert repo.get("runs", path) == written
    assert not list((config.run_dir() / "lineage-queue").glob("*.json"))


def test_resuming_on_another_data_commit_is_refused_unless_allowed_and_then_recorded(dataset):
    train(make_config(dataset, "moved", steps=4))
    other = publish_synthetic_dataset(
        LocalRepo(dataset.repo), "v2", {"web": 200, "code": 200}, total_samples=1200, seed=1
    )
    moved = make_config(dataset, "moved", steps=8, commit=other)
    with pytest.raises(DataChangeRefused) as refused:
        train(moved)
    assert dataset.commit in str(refused.value) and other in str(refused.value)
    assert "allow-data-change" in str(refused.value)
    assert [c.step for c in list_checkpoints(moved.run_dir() / "checkpoints")] == [0, 4]  # untouched

    train(moved.model_copy(update={"resume": "allow-data-change"}))
    meta = list_checkpoints(moved.run_dir() / "checkpoints")[-1].meta
    assert meta["step"] == 8 and meta["data"]["commit"] == other
    change = meta["data_changes"][0]
    assert (change["step"], change["from"]["commit"], change["to"]["commit"]) == (4, dataset.commit, other)
    event = lineage(dataset, "runs/moved/events/data-change-step-0000004.json")
    assert event["from"]["commit"] == dataset.commit and event["to"]["commit"] == other
    assert lineage(dataset, "runs/moved/checkpoints/step-0000008.json")["data"]["commit"] == other


def test_a_corrupted_newest_checkpoint_falls_back_to_the_previous_valid_one(dataset, capsys):
    config = make_config(dataset, "corrupt", steps=12)
    train(config)
    first = {r["step"]: r["loss"] for r in train_records(config.run_dir())}
    newest = config.run_dir() / "checkpoints/step-0000012/model.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))

    train(config.model_copy(update={"steps": 16}))
    assert "skipping checkpoint step-0000012" in capsys.readouterr().out
    resumed_at = [
        r["step"] for r in read_metrics(config.run_dir() / "metrics.jsonl") if r["kind"] == "resume"
    ]
    assert resumed_at == [0, 8]
    replayed = [r for r in train_records(config.run_dir())[12:] if r["step"] <= 12]
    assert [r["step"] for r in replayed] == [9, 10, 11, 12]
    assert all(r["loss"] == first[r["step"]] for r in replayed)


def test_spike_and_nan_roll_back_skip_their_window_and_a_later_resume_skips_it_too(dataset, tmp_path):
    spike_window = windows(dataset, tmp_path, 10, [])[9]  # step 10's samples
    nan_window = windows(dataset, tmp_path, 14, [spike_window])[13]  # step 14's, once step 10's are skipped
    faults = FaultConfig(spike_at_positions=(spike_window[0] + 1,), nan_at_positions=(nan_window[0],))
    checkpoint = CheckpointConfig(every=4, milestone_every=4)
    config = make_config(dataset, "spiky", faults=faults, checkpoint=checkpoint, log_samples=True)
    train(config)

    events = [r for r in read_metrics(config.run_dir() / "metrics.jsonl") if r["kind"] == "rollback"]
    assert [(e["at_step"], e["to_step"]) for e in events] == [(10, 8), (14, 12)]
    assert "spike" in events[0]["reason"] and "non-finite" in events[1]["reason"]
    assert [(e["window_start"], e["window_end"]) for e in events] == [spike_window, nan_window]
    final = list_checkpoints(config.run_dir() / "checkpoints")[-1].meta
    assert final["step"] == 16 and final["loader"]["skipped"] == [list(spike_window), list(nan_window)]
    assert len(final["rollbacks"]) == 2
    assert lineage(dataset, "runs/spiky/events/rollback-step-0000010.json")["window_start"] == spike_window[0]
    trained = {}
    for line in (config.run_dir() / "samples-rank0-of-1.jsonl").read_text().splitlines():
        entry = json.loads(line)
        trained[entry["step"]] = entry["positions"]
    for positions in trained.values():
        assert not set(positions) & {*faults.spike_at_positions, *faults.nan_at_positions}

    # The step-8 checkpoint was re-saved with the skip: a run resumed from it without the
    # spike fault still skips that window, and ends with the same weights.
    again = make_config(dataset, "spiky-again", faults=FaultConfig(nan_at_positions=faults.nan_at_positions))
    shutil.copytree(
        config.run_dir() / "checkpoints/step-0000008", again.run_dir() / "checkpoints/step-0000008"
    )
    train(again)
    expected, got = final_weights(config.run_dir(), 16), final_weights(again.run_dir(), 16)
    assert all(torch.equal(expected[k], got[k]) for k in expected)


def test_a_shard_whose_bytes_do_not_match_the_manifest_is_caught(dataset):
    repo = LocalRepo(dataset.repo)
    manifest = json.loads(repo.get(dataset.commit, "shards/manifest.json"))
    manifest["shards"][0]["sha256"] = "0" * 64
    repo.put("main", "shards/manifest.json", json.dumps(manifest).encode())
    commit = repo.commit("main", "manifest with a wrong checksum").id
    with pytest.raises(DataError, match=r"shards/code/shard-00000\.bin .* sha256 .*\(fetched twice\)"):
        train(make_config(dataset, "bad-shard", commit=commit))


def test_resume_never_refuses_a_run_that_has_checkpoints(dataset):
    train(make_config(dataset, "once", steps=4))
    with pytest.raises(TrainingError, match="already has checkpoints"):
        train(make_config(dataset, "once", steps=8, resume="never"))
