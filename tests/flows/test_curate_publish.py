"""Publishing on a real LocalRepo: merge + tag, idempotent retries, the lock, listing versions."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime

import pytest

from flows import publish_guard
from flows.wap import (
    MAIN,
    PUBLISH_LOCK_BRANCH,
    ChainLink,
    PublishBusy,
    PublishRecord,
    _take_over_dead_lock,
    flow_run_of_branch,
    list_versions,
    lock_candidate_branch,
    next_tag,
    open_run_branch,
    publish,
    publish_in_progress,
    publish_lock,
)
from versioning import HookFailed
from versioning.local import LocalRepo


@pytest.fixture
def repo(tmp_path):
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    return repo


def _run(
    repo: LocalRepo, branch: str, files: dict[str, bytes], gates: dict[str, str] | None = None
) -> tuple[str, list[ChainLink]]:
    """A run branch as the curate flow leaves it: each gated stage commits its report and records
    its gate (passed unless ``gates`` says otherwise), which main's publish guard checks."""
    open_run_branch(repo, branch)  # a new repository gets the guard here
    for path, data in files.items():
        repo.put(branch, path, data)
    chain = []
    for stage in publish_guard.gated_stages():
        verdict = (gates or {}).get(stage, "passed")
        report = {"stage": stage, "expectations": {"success": verdict == "passed"}}
        repo.put(branch, f"reports/{stage}.json", json.dumps(report).encode())
        commit = repo.commit(branch, stage, {"stage": stage, "gate": verdict}, allow_empty=True).id
        chain.append(ChainLink(stage, f"key-{stage}", commit))
    return chain[-1].commit, chain


def test_publish_merges_tags_and_records_the_chain(repo):
    head, chain = _run(repo, "curate-a", {"raw/s/part-00000.parquet": b"x"})
    version = publish(repo, head, chain, "run-a", "gates")
    assert version.new and version.tag == next_tag(repo).rsplit("-", 1)[0] + "-1"
    assert repo.list_tags()[version.tag] == version.commit_id == repo.resolve(MAIN)
    merge = repo.get_commit(MAIN)
    record = PublishRecord.from_commit(merge)
    assert record.run_head == head and record.chain == tuple(chain) and record.tag == version.tag
    assert repo.is_ancestor(head, MAIN)
    # what the publish guard reads: the gates of the merged commit's stages
    assert merge.metadata["gate"] == "passed" and merge.metadata["input_commit"] == head
    assert json.loads(merge.metadata["gates"]) == {
        "ingest": "passed",
        "validate": "passed",
        "shard": "passed",
    }


def test_main_refuses_a_run_whose_gate_failed_and_stays_where_it_was(repo):
    head, chain = _run(repo, "curate-a", {"a.txt": b"1"}, gates={"validate": "failed"})
    before = repo.resolve(MAIN)
    assert publish_guard.missing_files(repo) == []  # the new repository got the guard
    with pytest.raises(HookFailed, match="the validate gate is failed"):
        publish(repo, head, chain, "run-a", "g")
    assert repo.resolve(MAIN) == before and not [t for t in repo.list_tags() if t.startswith("ds-")]
    assert publish_in_progress(repo) is None  # the lock was released


def test_publish_retried_after_success_publishes_nothing_new(repo):
    head, chain = _run(repo, "curate-a", {"a.txt": b"1"})
    first = publish(repo, head, chain, "run-a", "g")
    again = publish(repo, head, chain, "run-a", "g")
    assert again.tag == first.tag and again.commit_id == first.commit_id
    assert len([t for t in repo.list_tags() if t.startswith("ds-")]) == 1


def test_publishing_the_data_main_already_holds_returns_its_version(repo):
    head, chain = _run(repo, "curate-a", {"a.txt": b"1"})
    first = publish(repo, head, chain, "run-a", "g")
    same, chain = _run(repo, "curate-b", {"a.txt": b"1"})  # a run that wrote what main has
    again = publish(repo, same, chain, "run-b", "g")
    assert not again.new and again.tag == first.tag and repo.resolve(MAIN) == first.commit_id


def test_tags_count_up_within_a_day(repo):
    now = datetime(2026, 1, 2, tzinfo=UTC)
    assert next_tag(repo, now) == "ds-20260102-1"
    repo.create_tag("ds-20260102-1", MAIN)
    repo.create_tag("ds-20260102-7", MAIN)
    assert next_tag(repo, now) == "ds-20260102-8"


def test_the_publish_lock_excludes_other_runs_and_names_its_holder(repo):
    with publish_lock(repo, "run-a"):
        holder = publish_in_progress(repo)
        assert holder["flow_run_id"] == "run-a" and holder["pid"]
        with pytest.raises(PublishBusy, match="another publish holds the lock"):
            with publish_lock(repo, "run-b", wait_s=0.2, poll_s=0.05):
                pass
    assert publish_in_progress(repo) is None and PUBLISH_LOCK_BRANCH not in repo.list_branches()


def test_a_lock_left_by_a_killed_attempt_of_the_same_run_is_taken_over(repo):
    repo.create_branch(PUBLISH_LOCK_BRANCH, MAIN)
    repo.commit(
        PUBLISH_LOCK_BRANCH, "lock", {"stage": "lock", "flow_run_id": "run-a", "pid": "1"}, allow_empty=True
    )
    with publish_lock(repo, "run-a", wait_s=0):
        assert publish_in_progress(repo)["flow_run_id"] == "run-a"
    assert publish_in_progress(repo) is None


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _left_lock(repo: LocalRepo, flow_run_id: str, host: str, pid: str) -> str:
    """The lock as a publisher killed while holding it leaves it; returns its commit."""
    repo.create_branch(PUBLISH_LOCK_BRANCH, MAIN)
    holder = {"stage": "lock", "flow_run_id": flow_run_id, "host": host, "pid": pid,
              "since": datetime.now(UTC).isoformat(timespec="seconds")}  # fmt: skip
    return repo.commit(PUBLISH_LOCK_BRANCH, "lock", holder, allow_empty=True).id


def test_a_lock_whose_holder_died_on_this_host_is_taken_over_by_another_run(repo):
    _left_lock(repo, "run-killed", socket.gethostname(), str(_dead_pid()))
    with publish_lock(repo, "run-b", wait_s=0):  # no wait: the dead holder is judged at once
        assert publish_in_progress(repo)["flow_run_id"] == "run-b"
    assert publish_in_progress(repo) is None


def test_a_lock_whose_holder_cannot_be_judged_from_here_is_not_taken_over(repo):
    _left_lock(repo, "run-elsewhere", "another-host", str(_dead_pid()))  # its pid means nothing here
    with pytest.raises(PublishBusy, match="run-elsewhere"):
        with publish_lock(repo, "run-b", wait_s=0):
            pass
    repo.delete_branch(PUBLISH_LOCK_BRANCH)
    _left_lock(repo, "run-alive", socket.gethostname(), str(os.getpid()))
    with pytest.raises(PublishBusy, match="run-alive"):
        with publish_lock(repo, "run-b", wait_s=0):
            pass
    assert publish_in_progress(repo)["flow_run_id"] == "run-alive", "a live holder's lock stays"


KILLED_TAKING_THE_LOCK = """
import os, sys
from flows.wap import PUBLISH_LOCK_BRANCH, lock_candidate_branch, publish_lock
from versioning.local import LocalRepo

class KilledAt(LocalRepo):
    # os._exit skips every finally and atexit, as a SIGKILL at this call would
    def create_branch(self, name, source="main"):
        if sys.argv[2] == "lock" and name == PUBLISH_LOCK_BRANCH:
            os._exit(9)
        return super().create_branch(name, source)

    def commit(self, branch, *args, **kwargs):
        if sys.argv[2] == "holder":
            os._exit(9)
        return super().commit(branch, *args, **kwargs)

    def delete_branch(self, name):
        taken = PUBLISH_LOCK_BRANCH in self.list_branches()
        if sys.argv[2] == "cleanup" and name == lock_candidate_branch("run-killed") and taken:
            os._exit(9)
        return super().delete_branch(name)

with publish_lock(KilledAt(sys.argv[1]), "run-killed"):
    pass
"""


@pytest.mark.parametrize("moment", ["holder", "lock", "cleanup"])
def test_a_publisher_killed_at_any_step_of_taking_the_lock_never_leaves_a_lock_without_its_holder(
    repo, moment
):
    killed = subprocess.Popen([sys.executable, "-c", KILLED_TAKING_THE_LOCK, str(repo.root), moment])
    assert killed.wait() == 9, f"the publisher was to die at {moment}"
    branches = repo.list_branches()
    assert lock_candidate_branch("run-killed") in branches, "the candidate is left, as after a kill"
    holder = publish_in_progress(repo)
    if moment == "cleanup":  # the lock was taken: it names the dead process, which is judged dead
        assert holder["flow_run_id"] == "run-killed" and holder["pid"] == str(killed.pid)
    else:
        assert holder is None and PUBLISH_LOCK_BRANCH not in branches
    with publish_lock(repo, "run-next", wait_s=0):  # no wait either way
        assert publish_in_progress(repo)["flow_run_id"] == "run-next"
    assert flow_run_of_branch(lock_candidate_branch("run-killed")) == "run-killed", (
        "the janitor judges a left candidate by its flow run, as it judges the run branch"
    )


def test_a_dead_lock_is_only_deleted_while_it_is_still_the_lock_that_was_judged(repo):
    judged = _left_lock(repo, "run-killed", socket.gethostname(), str(_dead_pid()))
    holder = publish_in_progress(repo)
    repo.delete_branch(PUBLISH_LOCK_BRANCH)  # another publisher took the dead lock over first...
    _left_lock(repo, "run-first", socket.gethostname(), str(os.getpid()))  # ...and holds its own
    _take_over_dead_lock(repo, judged, holder)
    assert publish_in_progress(repo)["flow_run_id"] == "run-first"


def test_a_waiting_publisher_gets_the_lock_when_it_is_released(repo):
    order = []
    release = threading.Event()

    def holder():
        with publish_lock(repo, "run-a"):
            order.append("a")
            release.wait(5)

    thread = threading.Thread(target=holder)
    thread.start()
    while publish_in_progress(repo) is None:
        time.sleep(0.01)
    release.set()
    with publish_lock(repo, "run-b", wait_s=30, poll_s=0.01):
        order.append("b")
    thread.join()
    assert order == ["a", "b"]


def test_a_run_branch_left_by_a_killed_attempt_restarts_from_main(repo):
    _run(repo, "curate-a", {"a.txt": b"1"})
    repo.put("curate-a", "partial.txt", b"half written")
    head = open_run_branch(repo, "curate-a")
    assert head == repo.resolve(MAIN) == repo.resolve("curate-a")
    assert not repo.exists("curate-a", "partial.txt")


def test_datasets_lists_versions_with_documents_and_tokens_per_source(repo):
    manifest = {
        "sources": {"code": {"sequences": 2, "tokens": 514}, "prose": {"sequences": 1, "tokens": 257}},
        "shards": [
            {"source": "code", "documents": 6},
            {"source": "code", "documents": 3},
            {"source": "prose", "documents": 4},
        ],
    }
    dedup = {"per_source": {"code": {"kept": 10}, "prose": {"kept": 4}}}
    head, chain = _run(
        repo,
        "curate-a",
        {
            "shards/manifest.json": json.dumps(manifest).encode(),
            "reports/dedup.json": json.dumps(dedup).encode(),
        },
    )
    version = publish(repo, head, chain, "run-a", "g")
    (listed,) = list_versions(repo)
    assert (
        listed.tag == version.tag and listed.commit_id == version.commit_id and listed.flow_run_id == "run-a"
    )
    assert listed.tokens == {"code": 514, "prose": 257} and listed.documents == {"code": 10, "prose": 4}
    assert listed.documents_in_shards == {"code": 9, "prose": 4}, (
        "the end-of-document tokens `shards verify` counts"
    )
