"""Lineage queries over hand-made versions and real lineage records, on both repository backends."""

from __future__ import annotations

import json
import shutil

import pytest

from flows.cli import main as tokenlake
from flows.lineage import (
    LineageError,
    checkpoint_lineage,
    checkpoints_on,
    describe_data,
    find_checkpoint,
    read_lineage,
)
from flows.step_samples import step_positions
from flows.wap import MAIN
from tests.flows.lineage_support import (
    BACKENDS,
    BAD_SOURCES,
    GOOD_SOURCES,
    publish_version,
    train_tiny,
    write_checkpoint_records,
)


def test_a_checkpoint_names_its_publish_stages_and_sources(backend):
    repo, _ = backend
    v1 = publish_version(repo, "flow-run-1", GOOD_SOURCES, seed=1)
    v2 = publish_version(repo, "flow-run-2", BAD_SOURCES, seed=2, source_configs=True)
    write_checkpoint_records(repo, "alpha", v1.commit_id, [0, 2, 4])
    write_checkpoint_records(repo, "beta", v2.commit_id, [0, 2])

    found = checkpoint_lineage(repo, "alpha@4")
    assert (found.checkpoint.run, found.checkpoint.step) == ("alpha", 4)
    data = found.data
    assert data.commit == data.publish_commit == v1.commit_id
    assert data.publish_tag == v1.tag and v1.tag in data.tags and data.kind == "publish"
    assert data.publish_flow_run_id == "flow-run-1"
    assert [(s.stage, s.config_hash, s.flow_run_id) for s in data.stages] == [
        ("ingest", "ingest-1", "flow-run-1"), ("shard", "", ""), ("mix", "mix-1", "flow-run-1"),
    ]  # fmt: skip
    assert [s["name"] for s in data.sources] == ["code", "web"]
    assert data.sources[0]["kind"] == "code" and "kept" not in data.sources[0]

    configured = checkpoint_lineage(repo, "beta@2").data.sources
    assert [(s["name"], s["path"]) for s in configured] == [(n, f"/data/{n}") for n in BAD_SOURCES]

    assert [c.name for c in checkpoints_on(repo, v1.tag)] == ["alpha@0", "alpha@2", "alpha@4"]
    assert [c.name for c in checkpoints_on(repo, v2.commit_id)] == ["beta@0", "beta@2"]
    assert checkpoints_on(repo, MAIN) == checkpoints_on(repo, v2.tag)
    assert checkpoints_on(repo, "runs") == []


def test_unknown_checkpoints_and_steps_fail_with_one_sentence(backend, tmp_path):
    repo, _ = backend
    v1 = publish_version(repo, "flow-run-1", GOOD_SOURCES, seed=1)
    write_checkpoint_records(repo, "alpha", v1.commit_id, [0, 2])
    with pytest.raises(LineageError, match=r"no lineage record for checkpoint alpha@3 .*steps: 0, 2"):
        find_checkpoint(repo, "alpha@3")
    with pytest.raises(LineageError, match="neither a checkpoint directory nor RUN@STEP"):
        find_checkpoint(repo, str(tmp_path / "missing"))
    with pytest.raises(LineageError, match="give a step from 1 to 2"):
        step_positions(repo, find_checkpoint(repo, "alpha@2"), 3)


def test_lineage_without_a_runs_branch_is_empty(backend):
    repo, _ = backend
    v1 = publish_version(repo, "flow-run-1", GOOD_SOURCES, seed=1)
    assert read_lineage(repo).commit is None
    assert checkpoints_on(repo, v1.tag) == []
    assert describe_data(repo, v1.tag).publish_tag == v1.tag


@pytest.mark.slow
def test_step_positions_are_the_samples_training_read(backend, tmp_path):
    """Replayed from lineage: equal to the sample log the trainer wrote, also across a spike rollback."""
    repo, spec = backend
    v1 = publish_version(repo, "flow-run-1", GOOD_SOURCES, seed=1)
    # a NaN loss on the batch holding position 30 (step 4) rolls back to step 2 and skips that batch
    result = train_tiny(spec, tmp_path / "home", "alpha", v1.tag, steps=6, log_samples=True,
                        faults={"nan_at_positions": [30]})  # fmt: skip
    log = [
        json.loads(line) for line in (result.run_dir / "samples-rank0-of-1.jsonl").read_text().splitlines()
    ]
    read = {entry["step"]: entry for entry in log}  # a replayed step's last entry is the one that counted
    index = read_lineage(repo, "alpha")
    assert [c.step for c in index.of_run("alpha")] == [0, 2, 4, 6]
    assert index.find("alpha", 6).record["loader"]["skipped"], "the NaN batch is skipped"
    last = find_checkpoint(repo, "alpha@6")
    for step in range(1, 7):
        positions = step_positions(repo, last, step)
        assert [p.position for p in positions] == read[step]["positions"]
        assert [f"{p.source}/{p.source_sequence}" for p in positions] == read[step]["samples"]
        assert all(p.shard.startswith(f"shards/{p.source}/shard-") for p in positions)
    checkpoint_dir = find_checkpoint(repo, "alpha@4").checkpoint
    assert find_checkpoint(repo, checkpoint_dir).name == "alpha@4", "a checkpoint directory names it too"
    assert step_positions(repo, find_checkpoint(repo, checkpoint_dir), 3) == step_positions(repo, last, 3)
    # the record alone is enough: another machine, without the run's files, gets the same answer
    expected = step_positions(repo, last, 5)
    shutil.rmtree(result.run_dir)
    assert step_positions(repo, find_checkpoint(repo, "alpha@6"), 5) == expected


def test_the_lineage_command_prints_tables_and_json(tmp_path, capsys):
    """``tokenlake lineage`` and a refused ``tokenlake rollback`` (answered before Prefect starts)."""
    with BACKENDS["local"](tmp_path) as (repo, spec):
        v1 = publish_version(repo, "flow-run-1", GOOD_SOURCES, seed=1)
        write_checkpoint_records(repo, "alpha", v1.commit_id, [0, 2])

        assert tokenlake(["--repo", spec, "lineage", "alpha@2"]) == 0
        text = capsys.readouterr().out
        assert f"published    {v1.tag} by merge {v1.commit_id[:12]} (curate flow run flow-run-1)" in text
        assert "ingest  " in text and "code  code" in text
        assert tokenlake(["--repo", spec, "lineage", v1.tag, "--json"]) == 0
        body = json.loads(capsys.readouterr().out)
        assert body["data"]["publish_tag"] == v1.tag
        assert [(c["checkpoint"], c["metrics"]["step"]) for c in body["checkpoints"]] == [
            ("alpha@0", 0),
            ("alpha@2", 2),
        ]

        assert tokenlake(["--repo", spec, "lineage", v1.tag, "--step", "1"]) == 2
        assert "--step needs a checkpoint" in capsys.readouterr().err
        assert tokenlake(["--repo", spec, "rollback", "--to", MAIN]) == 2
        assert "main already holds the content of 'main'" in capsys.readouterr().err
