"""lakeFS's server behaviour over raw HTTP, one test per documented behaviour.

No tokenlake adapter and no SDK: each test sends the requests a client would send
(``tests/versioning/lakefs_http.py``, plain ``requests``) and asserts the status code and
body that lakeFS v1.84.0 answers, citing the source file of lakeFS it reproduces. The
suite runs against the API double (``tests/lakefs_double``, backed by LocalRepo) and, in the
same run, against a real lakeFS v1.84.0 built from its Go module (``tests/lakefs_real``), so a
behaviour the double gets wrong fails here rather than hiding behind the adapter, and the
double cannot drift from lakeFS unnoticed. With ``TOKENLAKE_LAKEFS_ENDPOINT``,
``TOKENLAKE_LAKEFS_ACCESS_KEY_ID`` and ``TOKENLAKE_LAKEFS_SECRET_ACCESS_KEY`` set, the real side
is that server instead (``TOKENLAKE_LAKEFS_STORAGE_NAMESPACE`` names where its test
repositories go).

Issue 12's table, row by row: 1 identical bytes, 2 merge metadata, 3 one ref namespace,
4 tag names, 5 object keys, 6 the request validator, 7 storage namespaces, 8 hard reset.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.lakefs_double import LakeFSDouble
from tests.lakefs_real import real_lakefs
from tests.versioning.lakefs_http import Repo, Server, message, segment


@pytest.fixture(params=["lakefs-double", "lakefs-real"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    if request.param == "lakefs-real":
        real = real_lakefs()
        yield Server(
            real.endpoint, real.access_key_id, real.secret_access_key, namespace_prefix=real.namespace_prefix
        )
        return
    with LakeFSDouble(tmp_path / "lakefs-double") as double:
        yield Server(double.endpoint, double.access_key_id, double.secret_access_key, double)
        # The answers themselves must match the spec, errors included.
        assert double.violations == [], "\n".join(double.violations)


@pytest.fixture
def repo(server: Server) -> Iterator[Repo]:
    name = f"behaviour-{uuid.uuid4().hex[:12]}"
    response = server.create_repo(name, server.namespace(name))
    assert response.status_code == 201, response.text
    yield Repo(server, name)
    server.request("DELETE", f"/repositories/{name}")


# Row 1. pkg/catalog/entry.go (an entry's identity: size, ETag, metadata, content type) and
# pkg/graveler/committed/commit.go (an entry of equal identity is no change).


def test_commit_of_reuploaded_identical_bytes_is_no_changes(repo: Repo):
    head = repo.committed("main", {"a": b"same bytes", "b": b"b"})
    assert repo.upload("main", "a", b"same bytes").status_code == 201
    refused = repo.commit("main", "nothing new")
    assert refused.status_code == 400 and "no changes" in message(refused)
    assert repo.head("main") == head
    # pkg/graveler/uncommitted_diff_iterator.go: equal identity is not an uncommitted change,
    # so the branch is not dirty and a merge into it goes through.
    assert repo.uncommitted("main") == []
    assert repo.create_branch("dev").status_code == 201
    repo.committed("dev", {"c": b"c"})
    assert repo.merge("dev", "main").status_code == 200
    forced = repo.commit("main", "forced", allow_empty=True)
    assert forced.status_code == 201 and forced.json()["parents"] == [repo.get_commit("main~1")["id"]]
    assert repo.upload("main", "a", b"other bytes").status_code == 201
    assert repo.commit("main", "a real change").status_code == 201


# Commits: pkg/graveler/graveler.go Commit and pkg/graveler/committed/commit.go (AllowEmpty).


def test_empty_commit_needs_allow_empty(repo: Repo):
    head = repo.head("main")
    refused = repo.commit("main", "empty")
    assert refused.status_code == 400 and "no changes" in message(refused)
    assert repo.head("main") == head
    allowed = repo.commit("main", "empty on purpose", allow_empty=True, metadata={"why": "marker"})
    assert allowed.status_code == 201
    body = allowed.json()
    assert body["parents"] == [head] and body["metadata"] == {"why": "marker"}
    assert repo.head("main") == body["id"]


# Row 2. pkg/graveler/graveler.go Merge (MergeStrategyMetadataKey) and pkg/catalog/catalog.go
# Merge (the default message); a merge never fast-forwards.


def test_merge_commit_carries_the_strategy_key_the_server_adds(repo: Repo):
    assert repo.create_branch("dev").status_code == 201
    dev_head = repo.committed("dev", {"x": b"x"})
    main_head = repo.head("main")  # dev is ahead of main: a fast-forward would be possible
    merged = repo.merge("dev", "main", metadata={"stage": "publish"})
    assert merged.status_code == 200
    commit = repo.get_commit(merged.json()["reference"])
    assert commit["metadata"] == {"stage": "publish", ".lakefs.merge.strategy": "default"}
    assert commit["parents"] == [main_head, dev_head]
    assert commit["message"] == "Merge 'dev' into 'main'"


def test_nothing_to_merge_is_no_changes(repo: Repo):
    # pkg/graveler/committed/manager.go Merge: the source's tree is the merge base's.
    assert repo.create_branch("dev").status_code == 201
    refused = repo.merge("dev", "main")
    assert refused.status_code == 400 and "no changes" in message(refused)


def test_merge_conflict_is_409_and_changes_nothing(repo: Repo):
    # pkg/graveler/committed/merge.go (both sides changed a path) and pkg/api/controller.go
    # MergeIntoBranch (409 with a MergeResult).
    repo.committed("main", {"f": b"base"})
    assert repo.create_branch("dev").status_code == 201
    repo.committed("dev", {"f": b"dev"})
    head = repo.committed("main", {"f": b"main"})
    conflict = repo.merge("dev", "main")
    assert conflict.status_code == 409 and "reference" in conflict.json()
    assert repo.head("main") == head


def test_a_dirty_branch_refuses_merge_and_revert(repo: Repo):
    # pkg/graveler/graveler.go prepareForCommitIDUpdate (ErrDirtyBranch) -> 400.
    bad = repo.committed("main", {"a": b"1"})
    assert repo.create_branch("dev").status_code == 201
    repo.committed("dev", {"d": b"d"})
    head = repo.head("main")
    assert repo.upload("main", "uncommitted", b"u").status_code == 201
    merge = repo.merge("dev", "main")
    assert merge.status_code == 400 and "dirty branch" in message(merge)
    revert = repo.revert("main", ref=bad, parent_number=0)
    assert revert.status_code == 400 and "dirty branch" in message(revert)
    assert repo.head("main") == head and repo.uncommitted("main") == [("added", "uncommitted")]


# Reverts: pkg/graveler/graveler.go Revert, pkg/catalog/catalog.go Revert (message "Revert <ref>").


def test_revert_of_a_single_parent_commit_takes_parent_number_zero_or_one(repo: Repo):
    repo.committed("main", {"a": b"1", "b": b"1"})
    repo.committed("main", {"a": b"2", "c": b"new"})
    assert repo.revert("main", ref="main").status_code == 400  # parent_number is required by the spec
    reverted = repo.revert("main", ref="main", parent_number=0)
    assert reverted.status_code == 204
    commit = repo.get_commit("main")
    assert commit["message"] == "Revert main" and commit["metadata"] == {}
    assert repo.get_object("main", "a").content == b"1" and repo.get_object("main", "c").status_code == 404
    repo.committed("main", {"d": b"later"})
    assert repo.revert("main", ref="main~1", parent_number=1).status_code == 204  # revert the revert
    assert repo.get_commit("main")["message"] == "Revert main~1"  # the ref as given
    assert repo.get_object("main", "c").content == b"new" and repo.get_object("main", "d").content == b"later"


def test_revert_of_a_merge_commit_needs_its_parent_number(repo: Repo):
    repo.committed("main", {"base": b"b"})
    assert repo.create_branch("dev").status_code == 201
    repo.committed("dev", {"from-dev": b"d"})
    repo.committed("main", {"from-main": b"m"})
    merge = repo.merge("dev", "main").json()["reference"]
    no_parent = repo.revert("main", ref=merge, parent_number=0)
    assert no_parent.status_code == 409 and "parent number" in message(no_parent)
    assert repo.revert("main", ref=merge, parent_number=3).status_code == 400  # ErrParentOutOfRange
    assert repo.head("main") == merge
    assert repo.revert("main", ref=merge, parent_number=1).status_code == 204
    assert repo.get_object("main", "from-dev").status_code == 404
    assert repo.get_object("main", "from-main").content == b"m"


def test_revert_conflicting_with_a_later_change_is_409_and_of_an_empty_commit_no_changes(repo: Repo):
    repo.committed("main", {"a": b"1"})
    bad = repo.committed("main", {"a": b"2"})
    later = repo.committed("main", {"a": b"3"})
    assert repo.revert("main", ref=bad, parent_number=0).status_code == 409
    assert repo.head("main") == later
    empty = repo.commit("main", "marker", allow_empty=True).json()["id"]
    nothing = repo.revert("main", ref=empty, parent_number=0)
    assert nothing.status_code == 400 and "no changes" in message(nothing)


# Row 3. pkg/catalog/catalog.go CreateBranch / CreateTag / checkCommitIDDuplication.


def test_branches_tags_and_commit_ids_share_one_namespace(repo: Repo):
    head = repo.committed("main", {"a": b"1"})
    assert repo.create_tag("release").status_code == 201
    assert repo.create_branch("dev").status_code == 201
    assert repo.create_branch("release").status_code == 409  # a tag has that name
    assert repo.create_tag("dev").status_code == 409  # a branch has that name
    assert repo.create_branch(head).status_code == 409  # a commit has that id
    assert repo.create_tag(head).status_code == 409
    assert repo.create_branch("dev").status_code == 409  # pkg/graveler: ErrBranchExists
    assert repo.create_tag("release").status_code == 409  # ErrTagAlreadyExists
    branches = repo.call("GET", "/branches").json()["results"]
    tags = repo.call("GET", "/tags").json()["results"]
    assert sorted(b["id"] for b in branches) == ["dev", "main"]
    assert [(t["id"], t["commit_id"]) for t in tags] == [("release", head)]


# Row 4. pkg/graveler/validate.go ValidateTagID (git-check-ref-format, '~' allowed) and
# pkg/validator/validate.go ReValidBranchID.

ACCEPTED_TAGS = ["v1.0+build", "-v1", "täg", "v1~rc", ".hidden", "a@b", "UPPER_case"]
REFUSED_TAGS = [
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
]


@pytest.mark.parametrize("tag", ACCEPTED_TAGS)
def test_git_style_tag_names_are_accepted(repo: Repo, tag: str):
    head = repo.head("main")
    created = repo.create_tag(tag)
    assert created.status_code == 201 and created.json() == {"id": tag, "commit_id": head}
    fetched = repo.call("GET", f"/tags/{segment(tag)}")
    assert fetched.status_code == 200 and fetched.json()["commit_id"] == head


@pytest.mark.parametrize("tag", REFUSED_TAGS)
def test_tag_names_git_refuses_are_refused(repo: Repo, tag: str):
    assert repo.create_tag(tag).status_code == 400
    assert repo.call("GET", "/tags").json()["results"] == []


@pytest.mark.parametrize(
    ("branch", "status"), [("_x", 201), ("x-y_0", 201), ("-x", 400), ("a.b", 400), ("a/b", 400), ("ä", 400)]
)
def test_branch_names_follow_lakefs(repo: Repo, branch: str, status: int):
    assert repo.create_branch(branch).status_code == status


# Row 5. pkg/catalog/validate.go ValidatePath: any non-empty key of at most 1024 bytes.

KEYS = ["a//b", "dir/", "/absolute", "a/../b", "./a", "..", "ü/ß €", "k" * 1024]


def test_any_key_up_to_1024_bytes_is_an_object(repo: Repo):
    for key in KEYS:
        assert repo.upload("main", key, key.encode()).status_code == 201, key
    assert repo.commit("main", "keys").status_code == 201
    listed = repo.list_objects("main", amount=100).json()["results"]
    assert [entry["path"] for entry in listed] == sorted(KEYS)
    for key in KEYS:
        assert repo.get_object("main", key).content == key.encode()
        stat = repo.call("GET", "/refs/main/objects/stat", params={"path": key})
        assert stat.status_code == 200 and stat.json()["size_bytes"] == len(key.encode())
    under_a = repo.list_objects("main", prefix="a/").json()["results"]
    assert [entry["path"] for entry in under_a] == ["a/../b", "a//b"]
    assert repo.upload("main", "k" * 1025, b"x").status_code == 400
    assert repo.upload("main", "ü" * 513, b"x").status_code == 400  # 1026 bytes
    assert repo.upload("main", "", b"x").status_code == 400


# Row 6. pkg/api/serve.go OapiRequestValidatorWithOptions: a request that breaks the spec
# gets 400 from the validator, before authentication and before any handler.


@pytest.mark.parametrize("amount", ["1001", "-2", "many"])
def test_a_request_outside_the_spec_is_400_before_any_handler(repo: Repo, amount: str):
    refused = repo.call("GET", "/branches", params={"amount": amount})
    assert refused.status_code == 400 and "amount" in message(refused)
    anonymous = repo.call("GET", "/branches", params={"amount": amount}, auth=False)
    assert anonymous.status_code == 400  # the validator runs before authentication
    assert repo.call("GET", "/branches", auth=False).status_code == 401
    assert repo.call("GET", "/branches", params={"amount": "1000"}).status_code == 200
    if repo.server.double is not None:
        assert [r.split(":")[0] for r in repo.server.double.rejected] == ["listBranches", "listBranches"]


def test_a_repository_id_outside_the_pattern_is_400(server: Server):
    created = server.create_repo("NOPE", server.namespace("nope"))
    assert created.status_code == 400 and "name" in message(created)  # the RepositoryCreation schema
    # pkg/catalog/catalog.go validates the id of an existing-repository call: 400, not 404.
    assert server.request("GET", "/repositories/NOPE").status_code == 400
    assert server.request("GET", "/repositories/no-such-repository").status_code == 404
    names = [
        r["id"] for r in server.request("GET", "/repositories", params={"amount": 1000}).json()["results"]
    ]
    assert "NOPE" not in names


def test_revert_without_parent_number_is_refused_by_the_spec(repo: Repo):
    head = repo.committed("main", {"a": b"1"})
    refused = repo.revert("main", ref=head)
    assert refused.status_code == 400 and "parent_number" in message(refused)


# Row 7. pkg/api/controller.go CreateRepository/ensureStorageNamespace: the namespace keeps
# lakeFS's marker object after the repository is deleted, so it is never used again.


def _create_once_the_deleted_name_is_free(server: Server, name: str, namespace: str) -> requests.Response:
    """lakeFS's CreateRepository first looks the name up through graveler's repository cache
    (pkg/api/controller.go; ``graveler.repository_cache.expiry`` 5 s, jitter 2 s), so a repository
    read shortly before its deletion still answers 409 "not unique" until its entry expires. The
    double has no cache and frees the name at once; both then refuse the namespace."""
    deadline = time.monotonic() + 60
    while True:
        answer = server.create_repo(name, namespace)
        if answer.status_code != 409 or time.monotonic() > deadline:
            return answer
        assert "not unique" in message(answer)
        time.sleep(0.2)


def test_a_storage_namespace_is_never_reused(server: Server):
    name = f"behaviour-{uuid.uuid4().hex[:12]}"
    namespace = server.namespace(name)
    assert server.create_repo(name, namespace).status_code == 201
    assert server.create_repo(name, server.namespace(name)).status_code == 409  # the name is taken
    assert server.request("DELETE", f"/repositories/{name}").status_code == 204
    again = _create_once_the_deleted_name_is_free(server, name, namespace)
    assert again.status_code == 400 and "already in use" in message(again)
    other = server.create_repo(f"{name}-b", namespace)
    assert other.status_code == 400 and "already in use" in message(other)
    fresh = server.create_repo(name, server.namespace(name))
    assert fresh.status_code == 201
    server.request("DELETE", f"/repositories/{name}")


def test_a_storage_namespace_outside_the_block_store_is_400(server: Server):
    # pkg/api/controller.go validateStorageNamespace: the block store's validity regex.
    config = server.request("GET", "/config").json()["storage_config"]
    validity = re.compile(config["blockstore_namespace_ValidityRegex"])
    outside = next(ns for ns in ("local://x", "s3://x", "gs://x", "mem://x") if not validity.match(ns))
    name = f"behaviour-{uuid.uuid4().hex[:12]}"
    assert server.create_repo(name, f"{outside}/{name}").status_code == 400


# Row 8. pkg/graveler/graveler.go ResetHard: the head moves; only sealed staging (a commit in
# flight) makes it refuse, so ordinary uncommitted writes stay on the branch.


def test_hard_reset_keeps_uncommitted_writes(repo: Repo):
    good = repo.committed("main", {"a": b"good"})
    repo.committed("main", {"a": b"later", "later": b"l"})
    assert repo.upload("main", "staged", b"s").status_code == 201
    assert repo.hard_reset("main", good).status_code == 204
    assert repo.head("main") == good
    assert repo.get_object("main", "a").content == b"good"
    assert repo.get_object("main", "later").status_code == 404
    assert repo.get_object("main", "staged").content == b"s"
    assert repo.uncommitted("main") == [("added", "staged")]
    discarded = repo.call("PUT", "/branches/main", json={"type": "reset"})  # resetBranch: discard
    assert discarded.status_code == 204 and repo.uncommitted("main") == []


# pkg/graveler/graveler.go DeleteBranch (ErrDeleteDefaultBranch) -> 403 in pkg/api/controller.go.


def test_the_default_branch_cannot_be_deleted(repo: Repo):
    assert repo.call("DELETE", "/branches/main").status_code == 403
    assert repo.create_branch("dev").status_code == 201
    assert repo.call("DELETE", "/branches/dev").status_code == 204
    assert repo.call("DELETE", "/branches/dev").status_code == 404


# Paging: pkg/api/controller.go paginationAmount/paginationFor, pkg/catalog/catalog.go
# ListBranches and ListCommits (``after`` is exclusive; a log page continues after a commit id).


def test_pages_follow_amount_after_and_has_more(repo: Repo):
    for name in ("b1", "b2", "b3", "b4"):
        assert repo.create_branch(name).status_code == 201
    first = repo.call("GET", "/branches", params={"amount": 2}).json()
    assert [r["id"] for r in first["results"]] == ["b1", "b2"]
    assert first["pagination"] == {"has_more": True, "next_offset": "b2", "results": 2, "max_per_page": 1000}
    second = repo.call("GET", "/branches", params={"amount": 2, "after": "b2"}).json()
    assert [r["id"] for r in second["results"]] == ["b3", "b4"]
    assert second["pagination"]["has_more"] is True
    last = repo.call("GET", "/branches", params={"amount": 2, "after": "b4"}).json()
    assert [r["id"] for r in last["results"]] == ["main"]
    assert last["pagination"]["has_more"] is False and last["pagination"]["next_offset"] == ""
    everything = repo.call("GET", "/branches", params={"amount": 0}).json()  # 0: the default page, 100
    assert len(everything["results"]) == 5 and everything["pagination"]["has_more"] is False
    assert (
        repo.call("GET", "/branches", params={"prefix": "b", "after": "b3"}).json()["results"][0]["id"]
        == "b4"
    )


def test_object_and_log_pages(repo: Repo):
    ids = [repo.committed("main", {f"d/{i}": b"x"}, f"commit {i}") for i in range(3)]
    objects = repo.list_objects("main", prefix="d/", amount=2).json()
    assert [e["path"] for e in objects["results"]] == ["d/0", "d/1"]
    assert objects["pagination"]["has_more"] is True and objects["pagination"]["next_offset"] == "d/1"
    rest = repo.list_objects("main", prefix="d/", amount=2, after="d/1").json()
    assert [e["path"] for e in rest["results"]] == ["d/2"] and rest["pagination"]["has_more"] is False
    log = repo.call("GET", "/refs/main/commits", params={"amount": 2}).json()
    assert [c["id"] for c in log["results"]] == [ids[2], ids[1]]
    assert log["pagination"]["has_more"] is True and log["pagination"]["next_offset"] == ids[1]
    older = repo.call("GET", "/refs/main/commits", params={"amount": 2, "after": ids[1]}).json()
    assert [c["id"] for c in older["results"]][:1] == [ids[0]]
    assert older["results"][-1]["message"] == "Repository created"


# Refs and auth.


def test_unknown_refs_and_objects_are_404(repo: Repo):
    assert repo.call("GET", "/branches/nowhere").status_code == 404
    assert repo.get_object("nowhere", "a").status_code == 404
    assert repo.get_object("main", "absent").status_code == 404
    assert repo.call("GET", "/commits/" + "f" * 64).status_code == 404


# Actions: pkg/actions/service.go (hooks of the source commit's _lakefs_actions/, a multierror
# of failed hook runs) and pkg/graveler/graveler.go (ErrHookAborted -> 412).

REFUSING_ACTION = b"""name: refuse
on:
  pre-merge:
    branches: [main]
hooks:
  - id: nope
    type: lua
    properties:
      script: |
        local hook = require("hook")
        hook.fail("merges into " .. action.branch_id .. " are closed")
"""


def test_a_pre_merge_hook_refusal_is_412_in_lakefs_envelope(repo: Repo):
    head = repo.committed("main", {"_lakefs_actions/refuse.yaml": REFUSING_ACTION})
    assert repo.create_branch("dev").status_code == 201
    repo.committed("dev", {"x": b"x"})
    refused = repo.merge("dev", "main")
    assert refused.status_code == 412
    text = message(refused)
    assert re.fullmatch(
        r"update branch main: pre-merge hook aborted, run id '\w+': 1 error occurred:\n"
        r"\t\* hook run id '0000_0000' failed on action 'refuse' hook 'nope': "
        r"action failed: merges into main are closed\n\n",
        text,
    ), text
    assert repo.head("main") == head


# Found by running this suite against the real server (issue 24): what the double answered
# differently, now the same on both.


def test_an_objects_etag_is_the_md5_of_its_bytes_everywhere_it_appears(repo: Repo):
    # pkg/block/s3 and pkg/block/local: a single-part upload's ETag is the MD5 hex of its bytes.
    data = b"hello, etag"
    md5 = hashlib.md5(data).hexdigest()
    uploaded = repo.upload("main", "a.txt", data)
    assert uploaded.status_code == 201 and uploaded.json()["checksum"] == md5
    assert repo.call("GET", "/refs/main/objects/stat", params={"path": "a.txt"}).json()["checksum"] == md5
    assert repo.get_object("main", "a.txt").headers["ETag"] == f'"{md5}"'
    head = repo.call("HEAD", "/refs/main/objects", params={"path": "a.txt"})
    assert head.status_code == 200 and head.headers["ETag"] == f'"{md5}"'
    repo.commit("main", "a")
    (listed,) = repo.list_objects("main").json()["results"]
    assert listed["checksum"] == md5


def test_commits_carry_generation_and_version_and_repositories_a_storage_id(repo: Repo):
    first = repo.get_commit(repo.committed("main", {"a": b"1"}))
    assert (first["generation"], first["version"]) == (2, 1)  # "Repository created" is generation 1
    assert repo.create_branch("dev").status_code == 201
    repo.committed("dev", {"d": b"1"})
    repo.committed("dev", {"d": b"2"})
    merged = repo.get_commit(repo.merge("dev", "main").json()["reference"])
    assert merged["generation"] == 5  # one more than its highest parent (dev's head, generation 4)
    assert repo.call("GET", "").json()["storage_id"] == ""


def test_deleting_an_absent_object_is_204_and_a_staged_removal_has_no_size(repo: Repo):
    assert repo.call("DELETE", "/branches/main/objects", params={"path": "never-there"}).status_code == 204
    repo.committed("main", {"gone": b"12345"})
    assert repo.call("DELETE", "/branches/main/objects", params={"path": "gone"}).status_code == 204
    (removal,) = repo.call("GET", "/branches/main/diff").json()["results"]
    assert (removal["type"], removal["path"], removal["size_bytes"]) == ("removed", "gone", 0)
    removed_at = repo.commit("main", "remove").json()["id"]
    (committed,) = repo.call("GET", f"/refs/{removed_at}~1/diff/{removed_at}").json()["results"]
    assert (committed["type"], committed["size_bytes"]) == ("removed", 5)


def test_a_listed_object_without_user_metadata_has_no_metadata_map(repo: Repo):
    repo.committed("main", {"committed": b"c"})
    assert repo.upload("main", "staged", b"s").status_code == 201
    entries = {e["path"]: e for e in repo.list_objects("main").json()["results"]}
    assert "metadata" not in entries["committed"] and "metadata" not in entries["staged"]
    stat = repo.call("GET", "/refs/main/objects/stat", params={"path": "committed"}).json()
    assert stat["metadata"] == {}
