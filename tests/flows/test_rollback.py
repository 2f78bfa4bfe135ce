"""Rollback's core on hand-made versions: restore by reverts or a restore commit, hard reset,
refusals, and which checkpoints are tainted; on both repository backends."""

from __future__ import annotations

import json

import pytest

from flows.lineage import checkpoints_on, describe_data, read_lineage
from flows.restore import RollbackRefused, plan_rollback, restore_main
from flows.taint import find_tainted, mark_tainted, rollback_record
from flows.wap import MAIN, publish_lock
from tests.flows.lineage_support import (
    BAD_SOURCES,
    GOOD_SOURCES,
    publish_version,
    write_checkpoint_records,
)
from versioning import DataRepo


def _contents(repo: DataRepo, ref: str) -> dict[str, bytes]:
    return {s.path: repo.get(ref, s.path) for s in repo.list(ref)}


def test_rollback_reverts_each_newer_publish_and_keeps_history(backend):
    repo, _ = backend
    v1 = publish_version(repo, "run-1", GOOD_SOURCES, seed=1)
    v2 = publish_version(repo, "run-2", BAD_SOURCES, seed=2)
    v3 = publish_version(repo, "run-3", BAD_SOURCES, seed=3)
    expected = _contents(repo, v1.tag)

    plan = plan_rollback(repo, v1.tag)
    assert plan.to_revert == (v3.commit_id, v2.commit_id)
    restored = restore_main(repo, plan, "flow-1")

    assert repo.diff(v1.tag, MAIN) == [] and _contents(repo, MAIN) == expected
    assert restored.method == "revert" and restored.reverted == (v3.commit_id, v2.commit_id)
    assert repo.list_tags()[restored.tag] == restored.head == repo.resolve(MAIN)
    head = repo.get_commit(MAIN)
    assert head.metadata["stage"] == "rollback" and head.metadata["target"] == v1.commit_id
    assert json.loads(head.metadata["reverted"]) == [v3.commit_id, v2.commit_id]
    assert head.metadata["flow_run_id"] == "flow-1"
    history = [c.id for c in repo.log(MAIN)]
    assert {v1.commit_id, v2.commit_id, v3.commit_id, *restored.revert_commits} <= set(history)
    assert repo.is_ancestor(v3.commit_id, MAIN), "history is kept: the bad versions stay reachable"
    assert describe_data(repo, MAIN).publish_tag == v1.tag, "the rollback commit holds v1's content"
    undo_v3, undo_v2 = restored.revert_commits
    assert describe_data(repo, undo_v3).publish_tag == v2.tag, "one revert in, main held v2's content"
    assert describe_data(repo, undo_v2).publish_tag == v1.tag


def test_a_target_reached_through_a_merge_gets_a_restore_commit(backend):
    """The ingest commit of v1's curate run is an ancestor of main only through v1's merge."""
    repo, _ = backend
    v1 = publish_version(repo, "run-1", GOOD_SOURCES, seed=1)
    publish_version(repo, "run-2", BAD_SOURCES, seed=2)
    ingest = describe_data(repo, v1.tag).stages[0].commit
    restored = restore_main(repo, plan_rollback(repo, ingest), "flow-1")
    assert restored.method == "revert+restore" and restored.restore_commit
    assert _contents(repo, MAIN) == _contents(repo, ingest)


def test_hard_reset_only_when_asked(backend):
    repo, _ = backend
    v1 = publish_version(repo, "run-1", GOOD_SOURCES, seed=1)
    v2 = publish_version(repo, "run-2", BAD_SOURCES, seed=2)
    restored = restore_main(repo, plan_rollback(repo, v1.tag, hard=True), "flow-1")
    assert restored.method == "hard-reset" and repo.resolve(MAIN) == v1.commit_id
    assert not repo.is_ancestor(v2.commit_id, MAIN)
    assert repo.list_tags()[restored.tag] == v1.commit_id


def test_refusals_name_what_to_do(backend):
    repo, _ = backend
    v1 = publish_version(repo, "run-1", GOOD_SOURCES, seed=1)
    repo.create_branch("elsewhere", MAIN)
    repo.put("elsewhere", "note.txt", b"never on main")
    side = repo.commit("elsewhere", "a side commit").id
    publish_version(repo, "run-2", BAD_SOURCES, seed=2)

    with pytest.raises(RollbackRefused, match="is not an ancestor of main"):
        plan_rollback(repo, side)
    with pytest.raises(RollbackRefused, match="is not a tag, branch or commit"):
        plan_rollback(repo, "ds-19700101-9")
    with pytest.raises(RollbackRefused, match="main already holds the content"):
        plan_rollback(repo, MAIN)
    plan = plan_rollback(repo, v1.tag)
    with publish_lock(repo, "curate-flow-run-7"):
        with pytest.raises(RollbackRefused, match="curate run is publishing .*curate-flow-run-7"):
            plan_rollback(repo, v1.tag)
        with pytest.raises(RollbackRefused, match="curate run is publishing"):
            restore_main(repo, plan, "flow-1")
    publish_version(repo, "run-3", BAD_SOURCES, seed=3)
    with pytest.raises(RollbackRefused, match="main moved"):
        restore_main(repo, plan, "flow-1")


def test_checkpoints_on_data_that_left_main_are_tainted_and_kept(backend):
    repo, _ = backend
    v1 = publish_version(repo, "run-1", GOOD_SOURCES, seed=1)
    v2 = publish_version(repo, "run-2", BAD_SOURCES, seed=2)
    v2_ingest = describe_data(repo, v2.tag).stages[0].commit
    repo.create_branch("experiment", v2.tag)  # an unpublished change built on the bad version
    repo.put("experiment", "mix.json", b"{}")
    experiment = repo.commit("experiment", "try a mix").id
    write_checkpoint_records(repo, "good", v1.commit_id, [0, 2, 4])
    write_checkpoint_records(repo, "bad", v2.commit_id, [0, 2])
    write_checkpoint_records(repo, "staged", v2_ingest, [0])
    write_checkpoint_records(repo, "built-on-bad", experiment, [0])

    plan = plan_rollback(repo, v1.tag)
    restored = restore_main(repo, plan, "flow-1")
    write_checkpoint_records(repo, "after", restored.head, [0])
    index = read_lineage(repo)
    record = rollback_record(repo, plan, restored, "flow-1")
    tainted = find_tainted(repo, index, record)
    assert [c.name for c in tainted] == ["bad@0", "bad@2", "built-on-bad@0", "staged@0"]
    mark_tainted(repo, tainted, record, "flow-1")

    index = read_lineage(repo)
    assert {c.name for c in index.checkpoints if c.tainted} == {c.name for c in tainted}
    assert len(index.checkpoints) == 8, "nothing is deleted"
    mark = index.find("bad", 2).taints[0]
    assert (mark.rollback, mark.target, mark.data_commit) == (restored.tag, v1.commit_id, v2.commit_id)
    assert [r["tag"] for r in index.rollbacks] == [restored.tag]
    assert index.rollbacks[0]["tainted"] == [c.name for c in tainted]
    assert describe_data(repo, v2.tag, index).reverted_by == (restored.tag,)
    assert all(not c.tainted for c in checkpoints_on(repo, v1.tag, index))
