"""Lineage records survive an unreachable repository; the spike detector's judgement and state."""

from __future__ import annotations

import json
import math

from formats.layout import LINEAGE_BRANCH, checkpoint_record_path
from training.lineage import LineageWriter
from training.stability import SpikeDetector
from versioning import TransientError
from versioning.local import LocalRepo


class Outage:
    """Opens the real repository only while ``up``; otherwise fails as a down lakeFS would."""

    def __init__(self, root):
        self.root = root
        self.up = False
        self.attempts = 0

    def __call__(self) -> LocalRepo:
        self.attempts += 1
        if not self.up:
            raise TransientError("connection refused (lakeFS is down)")
        return LocalRepo(self.root)


def test_a_replayed_record_commits_nothing_and_leaves_the_queue_empty(tmp_path):
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    writer = LineageWriter(lambda: LocalRepo(tmp_path / "repo"), "r1", tmp_path / "queue", warn=print)
    record = {"step": 4, "data": {"commit": "abc"}}
    writer.record(checkpoint_record_path("r1", 4), record)
    assert writer.flush() is True
    head = repo.resolve(LINEAGE_BRANCH)
    # A step replayed after a resume writes the same bytes again: lakeFS (and the port) call
    # that "no changes", and the writer takes it as already written.
    writer.record(checkpoint_record_path("r1", 4), record)
    assert writer.flush() is True and writer.pending() == []
    assert repo.resolve(LINEAGE_BRANCH) == head
    writer.record(checkpoint_record_path("r1", 8), {"step": 8, "data": {"commit": "abc"}})
    assert writer.flush() is True and repo.resolve(LINEAGE_BRANCH) != head


def test_records_queue_while_the_repository_is_unreachable_and_are_written_later(tmp_path):
    LocalRepo(tmp_path / "repo").ensure()
    outage = Outage(tmp_path / "repo")
    warnings = []
    writer = LineageWriter(outage, "r1", tmp_path / "queue", retry_seconds=0.01, warn=warnings.append).start()
    writer.record(checkpoint_record_path("r1", 4), {"step": 4, "data": {"commit": "abc"}})
    writer.record(checkpoint_record_path("r1", 8), {"step": 8, "data": {"commit": "abc"}})
    assert len(writer.pending()) == 2  # recorded on disk at once, whatever the repository does
    assert writer.flush() is False
    assert len(writer.pending()) == 2 and "unreachable" in warnings[0]

    outage.up = True
    assert writer.close() is True
    repo = LocalRepo(tmp_path / "repo")
    record = json.loads(repo.get(LINEAGE_BRANCH, "runs/r1/checkpoints/step-0000008.json"))
    assert record == {"step": 8, "data": {"commit": "abc"}}
    assert repo.exists(LINEAGE_BRANCH, "runs/r1/checkpoints/step-0000004.json")
    assert writer.pending() == []


def test_a_later_writer_picks_up_what_an_earlier_one_left_queued(tmp_path):
    LocalRepo(tmp_path / "repo").ensure()
    outage = Outage(tmp_path / "repo")
    first = LineageWriter(outage, "r2", tmp_path / "queue", warn=lambda _: None)
    first.record(checkpoint_record_path("r2", 1), {"step": 1})
    assert first.close() is False  # the run ends while the repository is down
    outage.up = True
    LineageWriter(outage, "r2", tmp_path / "queue").close()
    assert LocalRepo(tmp_path / "repo").exists(LINEAGE_BRANCH, "runs/r2/checkpoints/step-0000001.json")


def test_spike_detector_flags_non_finite_values_and_outliers_only_after_enough_history():
    detector = SpikeDetector(window=8, zscore=4.0, min_history=4)
    assert detector.judge(9.0, 1.0).ok  # no history yet: nothing to compare with
    assert not detector.judge(math.nan, 1.0).ok
    assert "gradient" in detector.judge(3.0, math.inf).reason
    for loss in (3.0, 3.1, 2.9, 3.05, 2.95):
        detector.accept(loss)
    assert detector.judge(3.1, 1.0).ok
    assert detector.judge(2.0, 1.0).ok  # a sudden improvement is not a spike
    verdict = detector.judge(6.0, 1.0)
    assert not verdict.ok and verdict.zscore > 4.0 and "spike" in verdict.reason

    restored = SpikeDetector(window=8, zscore=4.0, min_history=4)
    restored.load_state_dict(detector.state_dict())
    assert restored.judge(6.0, 1.0) == verdict
    assert list(restored.losses) == list(detector.losses)
