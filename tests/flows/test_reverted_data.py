"""The rule of ``formats.rollbacks`` (and the trainer's refusal, ``training.reverted``) on hand-made versions, on both repository backends: which data
commits a rollback reverted, whenever they were committed or trained on; what makes them good
again; taint marks added by running the rollback again.
"""

from __future__ import annotations

import pytest

from flows.cli import main as tokenlake
from flows.lineage import describe_data, read_lineage
from flows.restore import AlreadyRestored, plan_rollback, restore_main
from flows.taint import find_tainted, mark_tainted, plan_or_marks, rollback_record
from flows.wap import MAIN
from formats.rollbacks import RecordedRollbacks
from tests.flows.lineage_support import BAD_SOURCES, GOOD_SOURCES, publish_version, write_checkpoint_records
from training.reverted import RevertedDataRefused, check_training_data
from versioning import DataRepo


def _roll_back(repo: DataRepo, to: str, flow_run_id: str, record: bool = True):
    """Restore main to ``to`` and, as the rollback flow does, write its record on ``runs``."""
    plan = plan_rollback(repo, to)
    restored = restore_main(repo, plan, flow_run_id)
    if record:
        rollback = rollback_record(repo, plan, restored, flow_run_id)
        mark_tainted(repo, find_tainted(repo, read_lineage(repo), rollback), rollback, flow_run_id)
    return restored


def _side_commit(repo: DataRepo, branch: str, source: str) -> str:
    repo.create_branch(branch, source)
    repo.put(branch, "mix.json", b'{"tried": "a mix"}')
    return repo.commit(branch, "try a mix").id


def _reverted(repo: DataRepo, *commits: str) -> dict[str, str]:
    """{commit: tag of the rollback that reverted it} for the reverted ones, judged afresh."""
    return {c: v.rollback for c, v in RecordedRollbacks.read(repo).verdicts(commits).items()}


def test_the_verdict_follows_the_data_whenever_it_was_committed(backend):
    repo, _ = backend
    v1 = publish_version(repo, "run-1", GOOD_SOURCES, seed=1)
    v2 = publish_version(repo, "run-2", BAD_SOURCES, seed=2)
    v3 = publish_version(repo, "run-3", BAD_SOURCES, seed=3)
    v2_ingest = describe_data(repo, v2.tag).stages[0].commit
    before = _side_commit(repo, "before", v2.tag)  # built on the bad version before the rollback
    assert _reverted(repo, v1.commit_id, v2.commit_id, before) == {}, "no rollback yet: nothing is reverted"

    restored = _roll_back(repo, v1.tag, "flow-1")
    after = _side_commit(repo, "after", v3.tag)  # built on a bad version after the rollback
    fresh = _side_commit(repo, "fresh", MAIN)  # built on main after the rollback: has the reverts
    undo_v3, undo_v2 = restored.revert_commits  # hold v2's, then v1's content
    v4 = publish_version(repo, "run-4", GOOD_SOURCES, seed=4)

    bad = [v2.commit_id, v3.commit_id, v2_ingest, before, after, undo_v3]
    good = [v1.commit_id, restored.head, undo_v2, fresh, v4.commit_id]
    assert _reverted(repo, *bad, *good) == dict.fromkeys(bad, restored.tag)
    assert repo.is_ancestor(v2.commit_id, MAIN), "the reverted commits stay in main's history"


def test_a_rollback_whose_record_was_never_written_is_known_by_its_tag(backend):
    repo, _ = backend
    v1 = publish_version(repo, "run-1", GOOD_SOURCES, seed=1)
    v2 = publish_version(repo, "run-2", BAD_SOURCES, seed=2)
    restored = _roll_back(repo, v1.tag, "flow-1", record=False)  # the flow died after tagging main
    assert read_lineage(repo).rollbacks == []
    assert _reverted(repo, v2.commit_id, v1.commit_id, restored.head) == {v2.commit_id: restored.tag}


def test_restoring_or_republishing_the_same_content_makes_it_good_again(backend, capsys):
    repo, spec = backend
    v1 = publish_version(repo, "run-1", GOOD_SOURCES, seed=1)
    v2 = publish_version(repo, "run-2", BAD_SOURCES, seed=2)
    v3 = publish_version(repo, "run-3", BAD_SOURCES, seed=3)
    write_checkpoint_records(repo, "on-v2", v2.commit_id, [0])
    first = _roll_back(repo, v1.tag, "flow-1")
    assert _reverted(repo, v2.commit_id, v3.commit_id) == {v2.commit_id: first.tag, v3.commit_id: first.tag}
    assert read_lineage(repo).find("on-v2", 0).marked

    # rolling back to v2 rolls back past the first rollback: v2 is good again, v3 is not
    second = _roll_back(repo, v2.tag, "flow-2")
    assert repo.diff(v2.tag, MAIN) == []
    judged = _reverted(repo, v1.commit_id, v2.commit_id, v3.commit_id, first.head, second.head)
    assert judged == {v3.commit_id: second.tag}, "first.head holds v1's content, which v2 contains"
    on_v2 = read_lineage(repo).find("on-v2", 0)
    assert not on_v2.tainted and [m.rollback for m in on_v2.taints] == [first.tag], (
        "the mark stays, as history"
    )
    capsys.readouterr()
    assert tokenlake(["--repo", spec, "lineage", "on-v2@0"]) == 0
    shown = capsys.readouterr().out
    assert f"marked       by {first.tag}" in shown and "good again" in shown and "TAINTED" not in shown

    # publishing v3's exact content again makes v3 good again; a different version would not
    v4 = publish_version(repo, "run-4", BAD_SOURCES, seed=3)
    assert v4.new and repo.diff(v3.tag, v4.tag) == []
    assert _reverted(repo, v3.commit_id) == {}
    # ... until a rollback takes that content off main again
    third = _roll_back(repo, v2.tag, "flow-3")
    assert _reverted(repo, v3.commit_id, v4.commit_id) == {v3.commit_id: third.tag, v4.commit_id: third.tag}


def test_rolling_back_again_marks_what_was_trained_on_reverted_data_since(backend):
    repo, _ = backend
    v1 = publish_version(repo, "run-1", GOOD_SOURCES, seed=1)
    v2 = publish_version(repo, "run-2", BAD_SOURCES, seed=2)
    write_checkpoint_records(repo, "early", v2.commit_id, [0, 2])
    restored = _roll_back(repo, v1.tag, "flow-1")
    write_checkpoint_records(repo, "late", v2.commit_id, [0, 2])  # saved (or recorded) after the rollback
    write_checkpoint_records(repo, "good", restored.head, [0])

    index = read_lineage(repo)
    assert {c.name: (c.tainted, c.marked) for c in index.checkpoints} == {
        "early@0": (True, True), "early@2": (True, True), "late@0": (True, False), "late@2": (True, False),
        "good@0": (False, False),
    }  # fmt: skip
    assert index.find("late", 2).reverted.rollback == restored.tag and index.find("late", 2).taints == ()

    assert plan_or_marks(repo, v1.tag) is None, "main holds v1 already: only marks are due"
    tainted = find_tainted(repo, index)
    assert [c.name for c in tainted] == ["late@0", "late@2"]
    mark_tainted(repo, tainted, None, "flow-2")
    index = read_lineage(repo)
    assert all(c.marked for c in index.checkpoints if c.tainted) and len(index.checkpoints) == 5
    assert index.find("late", 2).taints[0].rollback == restored.tag
    assert [r["tag"] for r in index.rollbacks] == [restored.tag], "marking records no new rollback"
    with pytest.raises(AlreadyRestored, match="every checkpoint trained on reverted data is marked"):
        plan_or_marks(repo, v1.tag)


def test_training_on_reverted_data_is_refused_with_one_sentence_unless_allowed(backend):
    repo, _ = backend
    v1 = publish_version(repo, "run-1", GOOD_SOURCES, seed=1)
    v2 = publish_version(repo, "run-2", BAD_SOURCES, seed=2)
    assert check_training_data(repo, v2.commit_id, allow_reverted=False) is None
    restored = _roll_back(repo, v1.tag, "flow-1")
    with pytest.raises(RevertedDataRefused) as refused:
        check_training_data(repo, v2.commit_id, allow_reverted=False)
    message = str(refused.value)
    assert f"data commit {v2.tag} ({v2.commit_id[:12]}) was reverted by {restored.tag}" in message
    assert f"main holds {v1.tag} ({v1.commit_id[:12]}) now" in message and "--allow-reverted" in message
    assert message.count(". ") == 0 and "\n" not in message, "one sentence"
    allowed = check_training_data(repo, v2.commit_id, allow_reverted=True)
    assert allowed is not None and allowed.rollback == restored.tag
    assert check_training_data(repo, repo.resolve(MAIN), allow_reverted=False) is None
