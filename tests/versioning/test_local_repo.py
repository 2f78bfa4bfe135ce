"""What only the local adapter promises: its on-disk layout, streaming, threads, trees."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import pickle
import sqlite3
import stat
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from versioning import Conflict, InvalidPath, NotFound, RepoError, open_repo
from versioning.local import LocalRepo, objects


@pytest.fixture
def local(tmp_path: Path) -> LocalRepo:
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    return repo


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of a few KiB, so small test objects cross many chunk boundaries."""
    monkeypatch.setattr(objects, "CHUNK_BYTES", 8192)
    monkeypatch.setattr(objects, "SMALL_BYTES", 4096)


def blob_files(repo: LocalRepo) -> list[Path]:
    return [p for p in (repo.root / "objects").glob("??/*") if p.is_file()]


def test_objects_are_stored_once_under_their_digest(local: LocalRepo):
    data = b"content-addressed"
    digest = objects.digest_of(local.object_hash, data)
    assert local.put("main", "a", data).checksum == digest
    local.put("main", "b/c", data)
    local.commit("main", "twice the same bytes")
    blob = local.root / "objects" / digest[:2] / digest[2:]
    assert blob_files(local) == [blob]
    assert blob.read_bytes() == data
    assert not blob.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    assert list((local.root / "objects" / "tmp").iterdir()) == []
    assert local.open("main", "b/c").name == str(blob)  # a real file on the blob, not a copy


def test_the_object_hash_is_recorded_once_and_kept(tmp_path: Path):
    new = LocalRepo(tmp_path / "new")
    new.ensure()
    assert new.object_hash == objects.NEW_REPOSITORY_HASH == "blake3"
    assert new.put("main", "a", b"x").checksum == objects.digest_of("blake3", b"x")
    old = LocalRepo(tmp_path / "old")
    old.ensure()
    with old._db.write() as conn:  # what a repository made before format 2 looks like
        conn.execute("DELETE FROM meta WHERE key='object_hash'")
    reopened = LocalRepo(tmp_path / "old")
    reopened.ensure()
    assert reopened.object_hash == "sha256", "an existing repository keeps its object ids"
    assert reopened.put("main", "a", b"x").checksum == hashlib.sha256(b"x").hexdigest()


def test_a_commit_is_the_first_call_of_a_fresh_handle(tmp_path: Path):
    LocalRepo(tmp_path / "repo").ensure()
    fresh = LocalRepo(tmp_path / "repo")  # its object store is opened lazily, inside the commit
    fresh.create_branch("lock", "main")
    commit = fresh.commit(
        "lock", "an empty commit, as the publish lock makes", {"stage": "lock"}, allow_empty=True
    )
    assert fresh.resolve("lock") == commit.id


def test_staged_objects_become_durable_at_commit(local: LocalRepo):
    data = os.urandom(3 << 20)
    digest = local.put("main", "big", data).checksum
    assert (local.root / "objects" / "pending" / digest).is_file(), "complete, not yet fsynced"
    assert local.get("main", "big") == data, "a staged object reads back before its commit"
    assert not (local.root / "objects" / digest[:2] / digest[2:]).exists()
    local.commit("main", "one syncfs for every object it makes durable")
    assert (local.root / "objects" / digest[:2] / digest[2:]).read_bytes() == data
    assert list((local.root / "objects" / "pending").iterdir()) == []


def test_name_defaults_to_the_sanitised_directory_name(tmp_path: Path):
    assert LocalRepo(tmp_path / "My Data_Set.v2").name == "my-data-set-v2"
    assert LocalRepo(tmp_path / "x").name == "x-repo"
    assert LocalRepo(tmp_path / "__").name == "repo"
    assert LocalRepo(tmp_path / "any", name="curated").name == "curated"
    with pytest.raises(InvalidPath, match="Bad_Name"):
        LocalRepo(tmp_path / "any", name="Bad_Name")


def test_a_missing_repository_says_to_check_the_path(tmp_path: Path):
    repo = LocalRepo(tmp_path / "absent")
    with pytest.raises(NotFound, match="no repository at .*check the path"):
        repo.list_branches()
    assert not (tmp_path / "absent").exists()  # reading never creates anything


def test_open_repo_opens_a_local_directory(tmp_path: Path):
    repo = open_repo(str(tmp_path / "via-spec"))
    assert isinstance(repo, LocalRepo)
    assert list(repo.list_branches()) == ["main"]


def test_ensure_refuses_a_file_in_the_way(tmp_path: Path):
    (tmp_path / "file").write_text("not a repository")
    with pytest.raises(Conflict, match="not a directory"):
        LocalRepo(tmp_path / "file").ensure()
    with pytest.raises(RepoError, match="cannot create a repository"):
        LocalRepo(tmp_path / "file" / "below").ensure()


@pytest.mark.parametrize("durable", [True, False])
def test_streams_cross_chunk_boundaries(tmp_path: Path, small_chunks: None, durable: bool):
    repo = LocalRepo(tmp_path / "repo", durable=durable)
    repo.ensure()
    data = os.urandom(100_003)
    source = tmp_path / "source"
    source.write_bytes(data)
    repo.put("main", "from-path", source)
    repo.put("main", "from-bytes", data)
    repo.put("main", "from-bytesio", io.BytesIO(data))
    repo.put("main", "short-reads", _TrickleReader(data))
    with open(source, "rb") as handle:
        handle.read(3)  # a file object is stored from its current position
        repo.put("main", "from-offset", handle)
        assert handle.tell() == len(data)
    assert {s.path: s.checksum for s in repo.list("main")} == {
        "from-bytes": objects.digest_of(repo.object_hash, data),
        "from-bytesio": objects.digest_of(repo.object_hash, data),
        "from-offset": objects.digest_of(repo.object_hash, data[3:]),
        "from-path": objects.digest_of(repo.object_hash, data),
        "short-reads": objects.digest_of(repo.object_hash, data),
    }
    assert repo.get("main", "from-offset") == data[3:]
    assert repo.get("main", "short-reads") == data


def test_falls_back_when_the_kernel_cannot_copy(
    local: LocalRepo, tmp_path: Path, small_chunks: None, monkeypatch: pytest.MonkeyPatch
):
    def unsupported(*args: object) -> int:
        raise OSError(errno.EXDEV, "cross-device copy not supported")

    monkeypatch.setattr(os, "copy_file_range", unsupported)
    data = os.urandom(50_000)
    (tmp_path / "source").write_bytes(data)
    assert local.put("main", "x", tmp_path / "source").checksum == objects.digest_of(local.object_hash, data)
    assert local.get("main", "x") == data
    with open(tmp_path / "source", "rb") as handle:
        handle.read(3)  # the reader's buffer now holds bytes past position 3
        local.put("main", "y", handle)
    assert local.get("main", "y") == data[3:]


class _TrickleReader(io.RawIOBase):
    """A stream that returns at most 1000 bytes per read, as pipes and sockets do."""

    def __init__(self, data: bytes):
        self._data = memoryview(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), 1000, len(self._data))
        buffer[:n] = self._data[:n]
        self._data = self._data[n:]
        return n


@pytest.mark.parametrize(
    ("source", "error", "match"),
    [
        (io.StringIO("text"), InvalidPath, "text-mode"),
        (12345, InvalidPath, "int"),
        ("/no/such/file", NotFound, "/no/such/file"),
    ],
)
def test_bad_put_sources_are_refused_clearly(local: LocalRepo, source: object, error: type, match: str):
    with pytest.raises(error, match=match):
        local.put("main", "x", source)  # type: ignore[arg-type]
    assert not local.exists("main", "x")


def test_a_directory_is_not_a_put_source(local: LocalRepo, tmp_path: Path):
    with pytest.raises(InvalidPath, match="directory"):
        local.put("main", "x", tmp_path)


def test_a_failed_put_leaves_no_temp_file(local: LocalRepo):
    class Broken(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
            raise OSError("disk unplugged")

    with pytest.raises(RepoError, match="unplugged") as caught:
        local.put("main", "x", Broken())
    assert "'x'" in str(caught.value) and isinstance(caught.value.__cause__, OSError)
    assert list((local.root / "objects" / "tmp").iterdir()) == []


def test_ensure_sweeps_temp_files_of_dead_writers(local: LocalRepo):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    temp_dir = local.root / "objects" / "tmp"
    orphan = temp_dir / f"{dead.stdout.strip()}-0123456789abcdef.tmp"
    ours = temp_dir / f"{os.getpid()}-fedcba9876543210.tmp"
    orphan.write_bytes(b"partial")
    ours.write_bytes(b"in progress")
    local.ensure()
    assert sorted(temp_dir.iterdir()) == [ours]


def test_default_branch_cannot_be_deleted(local: LocalRepo):
    with pytest.raises(Conflict, match="default branch"):
        local.delete_branch("main")


def test_commit_ids_resolve_from_a_unique_prefix_after_branches_and_tags(local: LocalRepo):
    root = local.resolve("main")
    commits = [root]
    for i in range(40):
        local.put("main", "a", str(i).encode())
        commits.append(local.commit("main", f"commit {i}").id)
    newest = commits[-1]
    assert local.resolve(newest[:8]) == newest
    unique = next(newest[:n] for n in range(1, 65) if sum(c.startswith(newest[:n]) for c in commits) == 1)
    assert local.resolve(unique) == newest  # lakeFS takes a prefix of any length
    first_digits = [c[0] for c in commits]
    shared = next(d for d in first_digits if first_digits.count(d) > 1)  # 41 ids, 16 digits
    with pytest.raises(NotFound, match="ambiguous"):
        local.resolve(shared)
    local.create_branch(unique, root)
    assert local.resolve(unique) == root  # a branch comes before a commit id prefix


def test_ancestry_suffixes(local: LocalRepo):
    root = local.resolve("main")
    local.put("main", "a", b"1")
    first = local.commit("main", "one").id
    local.create_branch("dev", "main")
    local.put("dev", "b", b"2")
    dev = local.commit("dev", "two").id
    local.put("main", "c", b"3")
    local.commit("main", "three")
    merge = local.merge("dev", "main")
    assert local.resolve("main~1") == local.get_commit(merge).parents[0]
    assert local.resolve("main^2") == dev
    assert local.resolve("main~2") == first == local.resolve("main^~1") == local.resolve("main^1~1^0")
    assert local.resolve(f"{dev[:10]}~2") == root
    local.put("main", "staged", b"s")
    assert not local.exists("main~0", "staged")  # a suffixed ref is a commit, not the branch
    with pytest.raises(NotFound, match="main~9"):
        local.resolve("main~9")
    with pytest.raises(InvalidPath, match="main\\^3"):
        local.resolve("main^3")  # lakeFS: an invalid ref, not a missing one
    assert local.resolve("main@") == local.resolve("main")
    assert not local.exists("main@", "staged") and local.exists("main", "staged")
    local.create_tag("v1", "main")
    for invalid in ("main$", "main@~1", "v1@", "~1", "main~x", "main 1"):
        with pytest.raises(InvalidPath):
            local.resolve(invalid)


def test_a_listing_is_a_snapshot(local: LocalRepo):
    for i in range(5):
        local.put("main", f"f{i}", b"x")
    listing = local.list("main")
    assert next(listing).path == "f0"
    local.delete("main", "f3")
    local.put("main", "f9", b"late")
    local.commit("main", "meanwhile")
    assert [s.path for s in listing] == ["f1", "f2", "f3", "f4"]


def test_commit_rewrites_only_the_changed_directories(tmp_path: Path):
    local = LocalRepo(tmp_path / "repo", durable=False)  # a thousand fsyncs would test nothing here
    local.ensure()
    for d in range(20):
        for f in range(50):
            local.put("main", f"data/dir{d:02}/file{f:02}", f"{d}/{f}".encode())
    local.commit("main", "1000 objects")
    before = _tree_rows(local)
    local.put("main", "data/dir07/file03", b"changed")
    local.commit("main", "one change")
    # The new rows: root (1) + data/ (20 dirs) + data/dir07/ (50 files).
    assert _tree_rows(local) - before == 1 + 20 + 50
    assert [c.path for c in local.diff(local.get_commit("main").parents[0], "main")] == ["data/dir07/file03"]


def _tree_rows(repo: LocalRepo) -> int:
    with sqlite3.connect(f"file:{repo.root / 'repo.db'}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT count(*) FROM tree_entries").fetchone()[0]


def test_one_instance_is_safe_across_threads(local: LocalRepo):
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            branch = f"thread-{index}"
            local.create_branch(branch, "main")
            for step in range(10):
                local.put(branch, f"t{index}/{step}", f"{index}:{step}".encode())
                local.commit(branch, f"{index}/{step}")
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for i in range(6):
        assert len(list(local.log(f"thread-{i}"))) == 11
        assert local.get(f"thread-{i}", f"t{i}/9") == f"{i}:9".encode()


def test_created_times_never_go_backwards(local: LocalRepo, monkeypatch):
    """A commit is never older than its parent, even when the clock steps back between the two
    (NTP, or another machine writing to the same repository), so log order stays child-first."""
    from versioning.local import repo as local_repo

    clock = [2_000_000_000.0]
    monkeypatch.setattr(local_repo, "time", SimpleNamespace(time=lambda: clock[0]))
    local.put("main", "a", b"a")
    first = local.commit("main", "a")
    clock[0] -= 3600.0  # the clock steps back an hour
    second = local.commit("main", "b", allow_empty=True)
    assert first.created == 2_000_000_000.0
    assert second.created >= first.created


def test_a_file_and_a_directory_may_share_a_name(local: LocalRepo):
    local.put("main", "a", b"file")
    local.put("main", "a/b", b"nested")
    local.commit("main", "both")
    assert local.get("main", "a") == b"file"
    assert [s.path for s in local.list("main")] == ["a", "a/b"]
    local.delete("main", "a")
    local.commit("main", "file gone")
    assert [s.path for s in local.list("main")] == ["a/b"]


def test_a_process_unpickles_one_repository_per_directory(tmp_path: Path):
    """Each partition task carries the repository; a worker must not open a connection per task."""
    repo = LocalRepo(tmp_path / "r", durable=False)
    repo.ensure()
    repo.put("main", "a.txt", io.BytesIO(b"x"))
    first, second = pickle.loads(pickle.dumps(repo)), pickle.loads(pickle.dumps(repo))
    assert first is second and first is not repo
    assert first.get("main", "a.txt") == b"x" and first._durable is False
    other = pickle.loads(pickle.dumps(LocalRepo(tmp_path / "r", durable=True)))
    assert other is not first and other._durable is True
