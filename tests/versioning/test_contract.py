"""The DataRepo contract: every backend in tests/versioning/backends.py must pass it.

Written against the port only. Commit ids and checksums differ between backends, so
the tests assert contents, structure and relations, never literal ids.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import pytest

from versioning import Conflict, DataRepo, InvalidPath, MergeConflict, NoChanges, NotFound
from versioning.port import Change

COMMIT_ID = re.compile(r"^[0-9a-f]{64}$")


def commit_files(repo: DataRepo, branch: str, files: dict[str, bytes | None], message: str = "change") -> str:
    """Put (or delete, for None) each file on ``branch`` and commit; returns the commit id."""
    for path, data in files.items():
        if data is None:
            repo.delete(branch, path)
        else:
            repo.put(branch, path, data)
    return repo.commit(branch, message).id


def contents(repo: DataRepo, ref: str, prefix: str = "") -> dict[str, bytes]:
    return {stat.path: repo.get(ref, stat.path) for stat in repo.list(ref, prefix)}


# refs


def test_a_new_repository_has_main_with_one_empty_commit(repo: DataRepo):
    branches = repo.list_branches()
    assert list(branches) == ["main"]
    assert COMMIT_ID.match(branches["main"])
    assert [c.id for c in repo.log("main")] == [branches["main"]]
    assert list(repo.list("main")) == []
    repo.ensure()  # idempotent
    assert repo.list_branches() == branches


def test_resolve_branch_tag_and_commit_id(repo: DataRepo):
    head = commit_files(repo, "main", {"a.txt": b"a"})
    repo.create_tag("v1", "main")
    assert repo.resolve("main") == head
    assert repo.resolve("v1") == head
    assert repo.resolve(head) == head
    assert repo.get_commit("v1").id == head


@pytest.mark.parametrize("ref", ["no-such-branch", "v9.9", "f" * 64])
def test_unknown_ref_is_not_found_naming_it(repo: DataRepo, ref: str):
    with pytest.raises(NotFound, match=re.escape(ref[:12])):
        repo.resolve(ref)
    with pytest.raises(NotFound, match=re.escape(ref[:12])):
        repo.get(ref, "a.txt")
    with pytest.raises(NotFound, match=re.escape(ref[:12])):
        repo.exists(ref, "a.txt")  # an unknown ref is an error, not an absent object


# branches


def test_branches_create_list_delete(repo: DataRepo):
    head = repo.resolve("main")
    assert repo.create_branch("dev", "main") == head
    assert repo.list_branches() == {"dev": head, "main": head}
    with pytest.raises(Conflict, match="dev"):
        repo.create_branch("dev", "main")
    repo.delete_branch("dev")
    assert list(repo.list_branches()) == ["main"]
    with pytest.raises(NotFound, match="dev"):
        repo.delete_branch("dev")
    with pytest.raises(NotFound, match="nowhere"):
        repo.create_branch("other", "nowhere")


def test_branch_from_tag_and_commit_id(repo: DataRepo):
    first = commit_files(repo, "main", {"a": b"1"})
    repo.create_tag("t1", first)
    commit_files(repo, "main", {"a": b"2"})
    assert repo.create_branch("from-tag", "t1") == first
    assert repo.create_branch("from-id", first) == first
    assert repo.get("from-tag", "a") == b"1"


@pytest.mark.parametrize("name", ["a/b", "-dash", "", "has space", "dot.dot", "x\x00"])
def test_invalid_branch_names_are_refused(repo: DataRepo, name: str):
    with pytest.raises(InvalidPath):
        repo.create_branch(name, "main")
    assert list(repo.list_branches()) == ["main"]


# objects


def test_put_from_bytes_file_object_and_path(repo: DataRepo, tmp_path: Path):
    source = tmp_path / "source.bin"
    source.write_bytes(b"from a path")
    with open(source, "rb") as real_file:
        repo.put("main", "in/real-file", real_file)
    repo.put("main", "in/bytes", b"plain bytes")
    repo.put("main", "in/bytearray", bytearray(b"a bytearray"))
    repo.put("main", "in/memoryview", memoryview(b"xx a memoryview")[3:])
    repo.put("main", "in/bytesio", io.BytesIO(b"a file object"))
    repo.put("main", "in/path-str", str(source))
    stat = repo.put("main", "in/path", source)
    assert (stat.path, stat.size) == ("in/path", len(b"from a path"))
    assert contents(repo, "main") == {
        "in/bytearray": b"a bytearray",
        "in/bytes": b"plain bytes",
        "in/bytesio": b"a file object",
        "in/memoryview": b"a memoryview",
        "in/path": b"from a path",
        "in/path-str": b"from a path",
        "in/real-file": b"from a path",
    }


def test_large_object_streams_in_and_out(repo: DataRepo, tmp_path: Path):
    data = os.urandom(3 << 20) + b"tail"
    source = tmp_path / "large.bin"
    source.write_bytes(data)
    stat = repo.put("main", "big/object.bin", source)
    assert stat.size == len(data)
    with repo.open("main", "big/object.bin") as reader:
        chunks = []
        while chunk := reader.read(1 << 20):
            chunks.append(chunk)
    assert b"".join(chunks) == data
    assert repo.stat("main", "big/object.bin").size == len(data)


def test_empty_object_round_trips(repo: DataRepo):
    repo.put("main", "empty", b"")
    assert repo.get("main", "empty") == b""
    assert repo.stat("main", "empty").size == 0


def test_get_stat_exists_and_checksums(repo: DataRepo):
    first = repo.put("main", "x/one", b"same bytes")
    second = repo.put("main", "y/two", b"same bytes")
    third = repo.put("main", "y/three", b"other bytes")
    assert first.checksum == second.checksum != third.checksum
    stat = repo.stat("main", "x/one")
    assert (stat.path, stat.size, stat.checksum) == ("x/one", 10, first.checksum)
    assert repo.exists("main", "x/one")
    assert not repo.exists("main", "x/none")
    assert not repo.exists("main", "x")  # a directory is not an object
    with pytest.raises(NotFound, match="x/none"):
        repo.get("main", "x/none")
    with pytest.raises(NotFound, match="x/none"):
        repo.stat("main", "x/none")
    with pytest.raises(NotFound, match="x/none"):
        repo.open("main", "x/none")


def test_overwrite_replaces_content(repo: DataRepo):
    commit_files(repo, "main", {"f": b"old"})
    repo.put("main", "f", b"new content")
    assert repo.get("main", "f") == b"new content"
    assert repo.stat("main", "f").size == len(b"new content")


def test_list_by_prefix_in_path_order(repo: DataRepo):
    files = {"data/b": b"1", "data/a.txt": b"2", "data/ab/x": b"3", "data/a-b": b"4", "other": b"5"}
    commit_files(repo, "main", dict(list(files.items())[:3]))
    for path, data in list(files.items())[3:]:
        repo.put("main", path, data)  # staged and committed objects interleave
    assert [s.path for s in repo.list("main")] == sorted(files)
    assert [s.path for s in repo.list("main", "data/a")] == ["data/a-b", "data/a.txt", "data/ab/x"]
    assert [s.path for s in repo.list("main", "data/")] == ["data/a-b", "data/a.txt", "data/ab/x", "data/b"]
    assert [s.size for s in repo.list("main", "other")] == [1]
    assert list(repo.list("main", "nothing/")) == []


def test_delete(repo: DataRepo):
    commit_files(repo, "main", {"keep": b"k", "gone": b"g"})
    repo.put("main", "staged-only", b"s")
    repo.delete("main", "gone")
    repo.delete("main", "staged-only")
    assert [s.path for s in repo.list("main")] == ["keep"]
    assert not repo.exists("main", "gone")
    with pytest.raises(NotFound, match="gone"):
        repo.delete("main", "gone")
    with pytest.raises(NotFound, match="never"):
        repo.delete("main", "never")
    repo.commit("main", "delete")
    assert [s.path for s in repo.list("main")] == ["keep"]


def test_writes_need_an_existing_branch(repo: DataRepo):
    repo.create_tag("v1", "main")
    with pytest.raises(NotFound, match="nobranch"):
        repo.put("nobranch", "a", b"x")
    with pytest.raises(NotFound):
        repo.put("v1", "a", b"x")
    with pytest.raises(NotFound, match="nobranch"):
        repo.commit("nobranch", "m", allow_empty=True)


def test_staged_changes_are_visible_on_the_branch_only(repo: DataRepo):
    base = commit_files(repo, "main", {"committed": b"c", "to-delete": b"d"})
    repo.create_branch("dev", "main")
    repo.put("main", "staged", b"s")
    repo.delete("main", "to-delete")
    assert set(contents(repo, "main")) == {"committed", "staged"}
    assert set(contents(repo, base)) == {"committed", "to-delete"}
    assert set(contents(repo, "dev")) == {"committed", "to-delete"}
    assert repo.resolve("main") == base
    new = repo.commit("main", "stage it").id
    assert contents(repo, new) == {"committed": b"c", "staged": b"s"}


# commits


def test_commit_metadata_and_parents_round_trip(repo: DataRepo):
    parent = repo.resolve("main")
    repo.put("main", "a", b"a")
    metadata = {"stage": "ingest", "input_commit": parent, "unicode": "naïve ✓"}
    commit = repo.commit("main", "ingest raw", metadata)
    assert COMMIT_ID.match(commit.id)
    assert repo.resolve("main") == commit.id
    stored = repo.get_commit(commit.id)
    assert (stored.message, stored.parents) == ("ingest raw", (parent,))
    assert stored.metadata == metadata
    assert next(repo.log("main")).metadata == metadata


def test_non_string_metadata_is_refused(repo: DataRepo):
    head = repo.resolve("main")
    repo.put("main", "a", b"a")
    with pytest.raises(InvalidPath, match="count"):
        repo.commit("main", "bad", {"count": 3})  # type: ignore[dict-item]
    assert repo.resolve("main") == head
    assert repo.exists("main", "a")


def test_commit_with_nothing_staged(repo: DataRepo):
    head = repo.resolve("main")
    with pytest.raises(NoChanges, match="main"):
        repo.commit("main", "nothing")
    empty = repo.commit("main", "marker", allow_empty=True)
    assert empty.parents == (head,)
    assert repo.diff(head, empty.id) == []


def test_reuploading_identical_bytes_is_no_change(repo: DataRepo):
    head = commit_files(repo, "main", {"a": b"same", "b": b"old"})
    repo.put("main", "a", b"same")
    repo.put("main", "gone", b"x")
    repo.delete("main", "gone")  # staged then removed: nothing
    with pytest.raises(NoChanges, match="main"):
        repo.commit("main", "identical")
    assert repo.resolve("main") == head
    repo.create_branch("dev", "main")
    commit_files(repo, "dev", {"c": b"from dev"})
    repo.merge("dev", "main")  # identical staged bytes do not make main dirty
    repo.put("main", "a", b"same")
    repo.put("main", "b", b"new")
    mixed = repo.commit("main", "one real change")
    assert repo.diff(mixed.parents[0], mixed.id) == [Change("b", "changed")]
    repo.put("main", "a", b"same")
    assert repo.diff(mixed.id, repo.commit("main", "forced", allow_empty=True).id) == []


# merge


def test_clean_merge_creates_a_merge_commit(repo: DataRepo):
    commit_files(repo, "main", {"shared": b"0", "removed-on-dev": b"r"})
    repo.create_branch("dev", "main")
    dev_head = commit_files(repo, "dev", {"dev-file": b"d", "shared": b"dev", "removed-on-dev": None})
    main_head = commit_files(repo, "main", {"main-file": b"m"})
    merge_id = repo.merge("dev", "main", message="merge dev", metadata={"why": "test"})
    merged = repo.get_commit("main")
    assert merged.id == merge_id
    assert merged.parents == (main_head, dev_head)
    assert merged.metadata == {"why": "test"}
    assert contents(repo, "main") == {"dev-file": b"d", "main-file": b"m", "shared": b"dev"}
    assert repo.is_ancestor("dev", "main")
    with pytest.raises(NoChanges):
        repo.merge("dev", "main")


def test_merge_from_tag_and_same_change_on_both_sides(repo: DataRepo):
    repo.create_branch("dev", "main")
    commit_files(repo, "dev", {"same": b"identical", "only-dev": b"d"})
    repo.create_tag("dev-1", "dev")
    commit_files(repo, "main", {"same": b"identical"})
    repo.merge("dev-1", "main")
    assert contents(repo, "main") == {"only-dev": b"d", "same": b"identical"}


def test_merge_conflict_lists_the_paths_and_changes_nothing(repo: DataRepo):
    commit_files(repo, "main", {"a": b"0", "b": b"0", "c": b"0"})
    repo.create_branch("dev", "main")
    commit_files(repo, "dev", {"b": b"dev", "a": b"dev", "c": b"same"})
    commit_files(repo, "main", {"b": b"main", "a": None, "c": b"same"})
    before = repo.resolve("main")
    with pytest.raises(MergeConflict) as caught:
        repo.merge("dev", "main")
    assert caught.value.paths == ["a", "b"]
    assert "a" in str(caught.value) and "dev" in str(caught.value)
    assert repo.resolve("main") == before
    assert repo.get("main", "b") == b"main"


def test_repeated_merges_use_the_newest_base(repo: DataRepo):
    commit_files(repo, "main", {"f": b"0"})
    repo.create_branch("dev", "main")
    commit_files(repo, "dev", {"f": b"1"})
    repo.merge("dev", "main")
    commit_files(repo, "dev", {"f": b"2"})  # against the root this would be a conflict
    repo.merge("dev", "main")
    assert repo.get("main", "f") == b"2"
    commit_files(repo, "main", {"g": b"main"})
    repo.merge("main", "dev")
    assert contents(repo, "dev") == {"f": b"2", "g": b"main"}


def test_merge_commits_return_only_the_callers_metadata(repo: DataRepo):
    repo.create_branch("dev", "main")
    commit_files(repo, "dev", {"x": b"x"})
    merged = repo.merge("dev", "main", metadata={"stage": "publish"})
    # lakeFS adds ".lakefs.merge.strategy"; the port returns what the caller wrote.
    assert repo.get_commit(merged).metadata == {"stage": "publish"}
    assert next(repo.log("main")).metadata == {"stage": "publish"}
    repo.put("main", "y", b"y")
    with pytest.raises(InvalidPath, match="reserved"):
        repo.commit("main", "reserved key", {".lakefs.merge.strategy": "mine"})


def test_merge_into_a_dirty_branch_is_a_conflict(repo: DataRepo):
    repo.create_branch("dev", "main")
    commit_files(repo, "dev", {"x": b"x"})
    repo.put("main", "uncommitted", b"u")
    with pytest.raises(Conflict, match="main"):
        repo.merge("dev", "main")
    assert not repo.exists("main", "x")
    assert repo.exists("main", "uncommitted")


# revert, reset, discard


def test_revert_a_commit(repo: DataRepo):
    commit_files(repo, "main", {"a": b"1", "b": b"1"})
    bad = commit_files(repo, "main", {"a": b"2", "b": None, "c": b"new"})
    commit_files(repo, "main", {"d": b"later"})
    reverted = repo.revert("main", bad, metadata={"reason": "bad data"})
    assert reverted.parents[0] != bad and len(reverted.parents) == 1
    assert reverted.metadata == {"reason": "bad data"}
    assert reverted.message == f"Revert {bad}"
    assert contents(repo, "main") == {"a": b"1", "b": b"1", "d": b"later"}


def test_revert_a_merge_commit_against_its_first_parent(repo: DataRepo):
    commit_files(repo, "main", {"base": b"b"})
    repo.create_branch("dev", "main")
    commit_files(repo, "dev", {"from-dev": b"d", "base": b"changed"})
    commit_files(repo, "main", {"from-main": b"m"})
    merge_id = repo.merge("dev", "main")
    repo.revert("main", merge_id, parent_number=1)
    assert contents(repo, "main") == {"base": b"b", "from-main": b"m"}
    assert len(list(repo.log("main"))) == len(list(repo.log(merge_id))) + 1


def test_revert_conflicting_with_a_later_change(repo: DataRepo):
    commit_files(repo, "main", {"a": b"1"})
    bad = commit_files(repo, "main", {"a": b"2"})
    later = commit_files(repo, "main", {"a": b"3"})
    with pytest.raises(Conflict):
        repo.revert("main", bad)
    assert repo.resolve("main") == later
    assert repo.get("main", "a") == b"3"


def test_reset_hard_drops_later_commits_and_keeps_staged_changes(repo: DataRepo):
    good = commit_files(repo, "main", {"a": b"good", "b": b"b"})
    later = commit_files(repo, "main", {"a": b"later"})
    repo.put("main", "staged", b"s")
    repo.delete("main", "b")
    repo.reset_hard("main", good)  # as lakeFS: the head moves, uncommitted changes stay
    assert repo.resolve("main") == good
    assert contents(repo, "main") == {"a": b"good", "staged": b"s"}
    assert later not in [c.id for c in repo.log("main")]
    kept = repo.commit("main", "the staged changes")
    assert repo.diff(good, kept.id) == [Change("b", "removed"), Change("staged", "added")]
    repo.put("main", "staged2", b"s")
    repo.discard_uncommitted("main")
    repo.reset_hard("main", good)  # discard first for a clean branch
    assert contents(repo, "main") == {"a": b"good", "b": b"b"}
    with pytest.raises(NoChanges):
        repo.commit("main", "nothing left")


def test_discard_uncommitted(repo: DataRepo):
    head = commit_files(repo, "main", {"a": b"a", "b": b"b"})
    repo.put("main", "a", b"changed")
    repo.put("main", "new", b"n")
    repo.delete("main", "b")
    repo.discard_uncommitted("main")
    assert repo.resolve("main") == head
    assert contents(repo, "main") == {"a": b"a", "b": b"b"}


# tags


def test_tags_are_immutable(repo: DataRepo):
    first = commit_files(repo, "main", {"a": b"1"})
    assert repo.create_tag("v1.0", "main") == first
    commit_files(repo, "main", {"a": b"2"})
    assert repo.resolve("v1.0") == first
    assert repo.get("v1.0", "a") == b"1"
    with pytest.raises(Conflict, match="v1.0"):
        repo.create_tag("v1.0", "main")
    assert repo.list_tags() == {"v1.0": first}
    with pytest.raises(NotFound, match="nowhere"):
        repo.create_tag("v2", "nowhere")
    repo.delete_tag("v1.0")
    assert repo.list_tags() == {}
    with pytest.raises(NotFound, match="v1.0"):
        repo.delete_tag("v1.0")


@pytest.mark.parametrize("tag", ["v1.0+build", "-v1", "täg", "v1~rc", ".hidden", "a@b", "UPPER_case"])
def test_git_style_tag_names_are_accepted(repo: DataRepo, tag: str):
    head = repo.resolve("main")
    assert repo.create_tag(tag, "main") == head
    assert repo.list_tags() == {tag: head}
    repo.delete_tag(tag)


@pytest.mark.parametrize(
    "tag",
    [
        "",
        "@",
        "v1.",
        "v1.lock",
        "a..b",
        "a/b",
        "a@{1}",
        "a^b",
        "a:b",
        "a?b",
        "a*b",
        "a[b",
        "a\\b",
        "a b",
        "a\tb",
    ],
)
def test_tag_names_lakefs_refuses_are_refused(repo: DataRepo, tag: str):
    with pytest.raises(InvalidPath):
        repo.create_tag(tag, "main")
    assert repo.list_tags() == {}


def test_branches_tags_and_commit_ids_share_one_namespace(repo: DataRepo):
    head = commit_files(repo, "main", {"a": b"1"})
    repo.create_tag("release", "main")
    repo.create_branch("dev", "main")
    with pytest.raises(Conflict, match="release"):
        repo.create_branch("release", "main")
    with pytest.raises(Conflict, match="dev"):
        repo.create_tag("dev", "main")
    with pytest.raises(Conflict, match=head[:12]):
        repo.create_branch(head, "main")
    with pytest.raises(Conflict, match=head[:12]):
        repo.create_tag(head, "main")
    assert repo.list_branches() == {"dev": head, "main": head}
    assert repo.list_tags() == {"release": head}


# history queries


def test_log_is_newest_first_with_limit(repo: DataRepo):
    ids = [commit_files(repo, "main", {"n": str(i).encode()}, f"commit {i}") for i in range(4)]
    log = list(repo.log("main"))
    assert [c.id for c in log[:4]] == ids[::-1]
    assert [c.message for c in log] == ["commit 3", "commit 2", "commit 1", "commit 0", log[-1].message]
    assert [c.id for c in repo.log("main", limit=2)] == ids[:1:-1]
    assert [c.id for c in repo.log(ids[1])] == [ids[1], ids[0], log[-1].id]


def test_log_of_a_merge_includes_both_sides(repo: DataRepo):
    repo.create_branch("dev", "main")
    dev = commit_files(repo, "dev", {"d": b"d"}, "on dev")
    main = commit_files(repo, "main", {"m": b"m"}, "on main")
    merge_id = repo.merge("dev", "main")
    ids = [c.id for c in repo.log("main")]
    assert ids[0] == merge_id
    assert {dev, main} <= set(ids) and len(ids) == len(set(ids)) == 4


def test_diff_is_two_dot_and_sorted(repo: DataRepo):
    left = commit_files(repo, "main", {"z/keep": b"k", "b/change": b"1", "a/remove": b"r"})
    right = commit_files(repo, "main", {"b/change": b"2", "a/remove": None, "c/add": b"a", "a/add": b"a"})
    assert repo.diff(left, right) == [
        Change("a/add", "added"),
        Change("a/remove", "removed"),
        Change("b/change", "changed"),
        Change("c/add", "added"),
    ]
    assert repo.diff(right, left) == [
        Change("a/add", "removed"),
        Change("a/remove", "added"),
        Change("b/change", "changed"),
        Change("c/add", "removed"),
    ]
    assert repo.diff(left, right, prefix="a/") == [Change("a/add", "added"), Change("a/remove", "removed")]
    assert repo.diff(left, left) == []


def test_is_ancestor(repo: DataRepo):
    root = repo.resolve("main")
    first = commit_files(repo, "main", {"a": b"1"})
    repo.create_branch("dev", "main")
    dev = commit_files(repo, "dev", {"b": b"2"})
    main = commit_files(repo, "main", {"c": b"3"})
    assert repo.is_ancestor(root, main)
    assert repo.is_ancestor(first, dev) and repo.is_ancestor(first, main)
    assert not repo.is_ancestor(dev, main) and not repo.is_ancestor(main, dev)
    assert not repo.is_ancestor(main, first)
    assert repo.is_ancestor(main, main)


# object keys: any lakeFS key (non-empty, at most 1024 bytes)

FOREIGN_KEYS = ["a//b", "dir/", "/absolute", "a/../b", "./a", "..", "ü/ß €", "k" * 1024, "ü" * 512]


def test_every_lakefs_key_is_read_listed_and_copied(repo: DataRepo):
    repo.create_branch("copy", "main")
    for key in FOREIGN_KEYS:
        repo.put("main", key, key.encode())
    first = repo.commit("main", "keys other tools write").id
    assert [s.path for s in repo.list(first)] == sorted(FOREIGN_KEYS)
    assert [s.path for s in repo.list(first, "a/")] == ["a/../b", "a//b"]
    assert [s.path for s in repo.list(first, "/")] == ["/absolute"]
    assert [s.path for s in repo.list(first, "dir/")] == ["dir/"]
    for key in FOREIGN_KEYS:
        assert repo.exists(first, key) and repo.stat(first, key).size == len(key.encode())
        with repo.open(first, key) as reader:
            repo.put("copy", key, reader)  # copying takes any key
        repo.delete("main", key)
    copied = repo.commit("copy", "copies").id
    assert contents(repo, copied) == {key: key.encode() for key in FOREIGN_KEYS}
    removed = repo.commit("main", "remove them").id
    assert repo.diff(first, removed) == [Change(key, "removed") for key in sorted(FOREIGN_KEYS)]


@pytest.mark.parametrize("path", ["", "k" * 1025, "ü" * 513, "a/\udcff"])
def test_keys_lakefs_refuses_are_refused(repo: DataRepo, path: str):
    with pytest.raises(InvalidPath):
        repo.put("main", path, b"x")
    with pytest.raises(InvalidPath):
        repo.get("main", path)
    with pytest.raises(InvalidPath):
        repo.exists("main", path)
    with pytest.raises(InvalidPath):
        repo.delete("main", path)
    assert list(repo.list("main")) == []
