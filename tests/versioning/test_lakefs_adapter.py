"""LakeFSRepo's retries: transient faults change nothing, and no write lands twice."""

from __future__ import annotations

import os
import random
import re
import threading
import tracemalloc
from pathlib import Path

import lakefs
import pytest

from tests.lakefs_double import FaultConfig, LakeFSDouble
from tests.versioning.lakefs_backends import connect
from versioning import Conflict, InvalidPath, NotFound, RepoError, TransientError
from versioning.lakefs import LakeFSRepo, RetryPolicy
from versioning.local import LocalRepo

COMMIT_ID = re.compile(r"[0-9a-f]{64}")  # commit ids differ between runs (they hash timestamps)


def history(repo) -> dict:
    """A curate-like history through every write of the port; returns what any reader can see."""
    repo.ensure()
    for i in range(3):
        repo.put("main", f"raw/part-{i}", bytes([i]) * 1000)
        repo.commit("main", f"ingest {i}", {"stage": "ingest", "part": str(i)})
    repo.create_branch("curate-1", "main")
    repo.put("curate-1", "shards/s0", b"s" * 5000)
    repo.delete("curate-1", "raw/part-0")
    repo.commit("curate-1", "shard")
    repo.merge("curate-1", "main", message="publish", metadata={"run": "1"})
    repo.create_tag("v1", "main")
    repo.put("main", "bad", b"bad")
    bad = repo.commit("main", "bad data")
    repo.revert("main", bad.id, metadata={"reason": "bad"})
    repo.put("main", "staged", b"x")
    repo.discard_uncommitted("main")
    repo.create_branch("scratch", "main")
    repo.delete_branch("scratch")
    repo.create_tag("doomed", "main")
    repo.delete_tag("doomed")
    repo.reset_hard("curate-1", "v1")
    return snapshot(repo)


def snapshot(repo) -> dict:
    def commits(ref: str) -> list:
        # Commits of parallel branches are ordered by time, which differs between runs.
        described = [
            (COMMIT_ID.sub("<id>", c.message), sorted(c.metadata.items()), len(c.parents))
            for c in repo.log(ref)
        ]
        return [described[0], *sorted(described[1:])]

    refs = sorted(repo.list_branches()) + sorted(repo.list_tags())
    return {
        "refs": refs,
        "logs": {ref: commits(ref) for ref in refs},
        "contents": {ref: {s.path: repo.get(ref, s.path) for s in repo.list(ref)} for ref in refs},
        "diff": repo.diff("v1", "main"),
        "ancestry": repo.is_ancestor("v1", "main"),
    }


def test_results_with_transient_faults_equal_results_without(tmp_path: Path):
    with LakeFSDouble(tmp_path / "clean") as double:
        expected = history(connect(double))
    with LakeFSDouble(
        tmp_path / "faulty", faults=FaultConfig(error_rate=0.15, drop_rate=0.25, seed=9)
    ) as double:
        observed = history(connect(double))
        injected = dict(double.injected)
        assert double.violations == []
    assert observed == expected
    assert injected.keys() == {"error", "drop_before", "drop_after"} and min(injected.values()) >= 5


@pytest.mark.parametrize("operation", ["commit", "mergeIntoBranch", "revertBranch"])
def test_a_write_whose_responses_are_all_lost_lands_exactly_once(tmp_path: Path, operation: str):
    with LakeFSDouble(tmp_path) as double:
        repo = connect(double)
        repo.ensure()
        repo.create_branch("dev", "main")
        repo.put("dev", "a", b"a")
        repo.commit("dev", "on dev")
        repo.put("main", "b", b"b")
        before = len(list(repo.log("main")))
        double.faults = FaultConfig(drop_rate=1.0, operations=frozenset({operation}), seed=3)
        if operation == "commit":
            result = repo.commit("main", "once", {"k": "v"}).id
        elif operation == "mergeIntoBranch":
            repo.commit("main", "on main")
            before += 2  # "on main", and "on dev" arrives with the merge
            result = repo.merge("dev", "main", metadata={"k": "v"})
        else:
            target = repo.commit("main", "to undo").id
            before += 1
            result = repo.revert("main", target, metadata={"k": "v"}).id
        assert double.injected["drop_after"] >= 1  # the write happened and its answer was lost
        log = list(repo.log("main"))
        assert len(log) == before + 1 and log[0].id == result and log[0].metadata == {"k": "v"}


def test_a_put_whose_response_is_lost_leaves_one_object(tmp_path: Path):
    with LakeFSDouble(tmp_path) as double:
        repo = connect(double)
        repo.ensure()
        double.faults = FaultConfig(drop_rate=0.7, operations=frozenset({"uploadObject"}), seed=4)
        stat = repo.put("main", "dir/object", b"payload" * 1000)
        assert double.injected["drop_after"] >= 1
        assert (
            [(s.path, s.size) for s in repo.list("main")]
            == [("dir/object", 7000)]
            == [(stat.path, stat.size)]
        )
        assert repo.get("main", "dir/object") == b"payload" * 1000


def test_creates_and_deletes_retried_after_lost_responses_keep_their_meaning(tmp_path: Path):
    refs = frozenset({"createBranch", "deleteBranch", "createTag", "deleteTag", "deleteObject"})
    with LakeFSDouble(tmp_path) as double:
        repo = connect(double)
        repo.ensure()
        repo.put("main", "f", b"f")
        double.faults = FaultConfig(drop_rate=1.0, operations=refs, seed=11)
        head = repo.resolve("main")
        assert repo.create_branch("dev", "main") == head
        assert repo.create_tag("t", "main") == head
        repo.delete("main", "f")
        repo.delete_branch("dev")
        repo.delete_tag("t")
        assert double.injected["drop_after"] >= 5  # every one of them happened with its answer lost
        assert repo.list_branches() == {"main": head} and repo.list_tags() == {}
        assert not repo.exists("main", "f")
        for gone in (
            lambda: repo.delete_branch("dev"),
            lambda: repo.delete_tag("t"),
            lambda: repo.delete("main", "f"),
        ):
            with pytest.raises(NotFound):
                gone()


def test_retries_are_bounded_and_the_error_names_the_endpoint(tmp_path: Path):
    with LakeFSDouble(tmp_path, faults=FaultConfig(error_rate=1.0)) as double:
        repo = connect(double, retry=RetryPolicy(attempts=3, base_delay_s=0.001, max_delay_s=0.001))
        with pytest.raises(TransientError, match="HTTP 503") as caught:
            repo.ensure()
        assert double.endpoint in str(caught.value)
        assert double.requests["getRepository"] == 3


def test_listings_resume_from_the_last_item_after_a_failed_page(tmp_path: Path):
    listed = frozenset({"listObjects", "logCommits", "diffRefs", "listBranches", "listTags"})
    with LakeFSDouble(tmp_path) as double:
        repo = connect(double, page_size=3)
        repo.ensure()
        base = repo.resolve("main")
        for i in range(10):
            repo.put("main", f"obj/{i:02d}", str(i).encode())
            repo.commit("main", f"c{i}")
            repo.create_branch(f"b{i}", "main")
            repo.create_tag(f"t{i}", "main")
        double.faults = FaultConfig(error_rate=0.3, drop_rate=0.2, operations=listed, seed=7)
        assert [s.path for s in repo.list("main", "obj/")] == [f"obj/{i:02d}" for i in range(10)]
        assert [c.message for c in repo.log("main")] == [f"c{i}" for i in reversed(range(10))] + [
            "Repository created"
        ]
        assert [c.message for c in repo.log("main", limit=7)] == [f"c{i}" for i in reversed(range(3, 10))]
        assert [c.path for c in repo.diff(base, "main")] == [f"obj/{i:02d}" for i in range(10)]
        assert len(repo.list_branches()) == 11 and len(repo.list_tags()) == 10
        assert sum(double.injected.values()) >= 5
        assert double.requests["listObjects"] > 4  # several pages, some of them retried


def test_reads_stream_in_ranges_and_seek_under_faults(tmp_path: Path):
    data = random.Random(1).randbytes(20 << 20)
    with LakeFSDouble(tmp_path) as double:
        repo = connect(double)
        repo.ensure()
        repo.put("main", "big", data)
        double.faults = FaultConfig(
            error_rate=0.2, drop_rate=0.2, operations=frozenset({"getObject"}), seed=2
        )
        with repo.open("main", "big") as reader:
            assert reader.read(10) == data[:10]
            reader.seek(-(9 << 20), os.SEEK_END)
            assert reader.tell() == len(data) - (9 << 20)
            assert reader.read() == data[-(9 << 20) :]
        assert double.injected and double.requests["getObject"] >= 3


def test_put_from_a_pipe_is_replayed_after_a_lost_response(tmp_path: Path):
    payload = random.Random(2).randbytes(3 << 20)
    read_end, write_end = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(write_end, payload), os.close(write_end)))
    writer.start()
    with LakeFSDouble(tmp_path) as double, open(read_end, "rb", buffering=0) as pipe:
        repo = connect(double)
        repo.ensure()
        double.faults = FaultConfig(drop_rate=0.7, operations=frozenset({"uploadObject"}), seed=4)
        repo.put("main", "from-pipe", pipe)
        writer.join()
        assert double.injected["drop_after"] >= 1
        assert repo.get("main", "from-pipe") == payload


def test_put_and_open_stream_without_holding_the_object_in_memory(tmp_path: Path):
    size = 96 << 20
    source = tmp_path / "large.bin"
    with open(source, "wb") as file:
        for _ in range(size >> 20):
            file.write(os.urandom(1 << 20))
    with LakeFSDouble(tmp_path / "backing") as double:
        repo = connect(double)
        repo.ensure()
        tracemalloc.start()
        try:
            assert repo.put("main", "large.bin", source).size == size
            with repo.open("main", "large.bin") as reader:
                total = 0
                while chunk := reader.read(4 << 20):
                    total += len(chunk)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert total == size
    assert peak < size / 2, f"peak traced memory {peak >> 20} MiB for a {size >> 20} MiB object"


def test_retry_delays_grow_exponentially_with_jitter_and_a_cap():
    policy = RetryPolicy(attempts=10, base_delay_s=0.1, max_delay_s=1.0)
    rng = random.Random(0)
    for failures, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)]:
        delays = [policy.delay(failures, rng) for _ in range(200)]
        assert ceiling / 2 <= min(delays) and max(delays) <= ceiling
        assert len(set(delays)) > 100  # jittered
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)


def test_errors_have_the_local_adapters_types(tmp_path: Path):
    def failures(repo) -> list[str]:
        repo.ensure()
        repo.put("main", "a", b"a")
        head = repo.commit("main", "c").id
        calls = [
            lambda: repo.delete_branch("main"),  # the default branch
            lambda: repo.revert("main", head, parent_number=2),
            lambda: repo.commit("main", "again"),
            lambda: repo.create_branch("main", head),
            lambda: repo.merge("main", "nowhere"),
            lambda: repo.stat(head, "missing"),
            lambda: repo.log("missing-ref"),
            lambda: repo.put("main", "a", 42),
        ]
        kinds = []
        for call in calls:
            with pytest.raises(RepoError) as caught:
                call()
            kinds.append(type(caught.value).__name__)
        return kinds

    with LocalRepo(tmp_path / "local") as local:
        expected = failures(local)
    with LakeFSDouble(tmp_path / "backing") as double:
        assert failures(connect(double)) == expected
    assert expected == [
        "Conflict",
        "InvalidPath",
        "NoChanges",
        "Conflict",
        "NotFound",
        "NotFound",
        "NotFound",
        "InvalidPath",
    ]


def test_the_write_marker_is_reserved():
    repo = LakeFSRepo.connect("http://127.0.0.1:9", "key", "secret", "demo")
    with pytest.raises(InvalidPath, match="tokenlake_write_id"):
        repo.commit("main", "m", {"tokenlake_write_id": "x"})


def test_a_storage_namespace_in_use_fails_with_one_sentence_naming_the_fix(tmp_path: Path):
    with LakeFSDouble(tmp_path / "backing") as double:
        repo = connect(double, "reborn")
        repo.ensure()
        client = lakefs.Client(
            host=double.endpoint, username=double.access_key_id, password=double.secret_access_key
        )
        lakefs.Repository("reborn", client=client).delete()  # lakeFS keeps a deleted repository's namespace
        with pytest.raises(Conflict, match="already in use") as caught:
            repo.ensure()
        assert "TOKENLAKE_LAKEFS_STORAGE_NAMESPACE" in str(caught.value)
        moved = connect(double, "reborn", storage_namespace=f"{repo.storage_namespace}-2")
        moved.ensure()
        assert list(moved.list_branches()) == ["main"]
        assert double.violations == [] and double.rejected == []
