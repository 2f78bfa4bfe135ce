"""lakeFS's answers when what a request names is missing: the status and the message, per operation.

Read off lakeFS v1.84.0 (``pkg/api/controller.go`` wraps each layer's ``ErrNotFound`` in its own
words) and asserted on the double and a real lakeFS alike (the fixtures of
``test_lakefs_behaviour.py``). tokenlake's adapter matches none of these messages (it names the
ref and path itself); the double answers them so that whatever a client reads, it reads from
both the same, and never the double's backing directory.
"""

from __future__ import annotations

import re

import pytest

from tests.versioning import test_lakefs_behaviour as behaviour
from tests.versioning.lakefs_http import Repo

server, repo = behaviour.server, behaviour.repo  # the same fixtures: the double and a real lakeFS

OCTET = {"Content-Type": "application/octet-stream"}
MISSING = [
    ("GET", "/branches/nowhere", {}, "branch not found"),
    ("DELETE", "/branches/nowhere", {}, "branch not found"),
    ("PUT", "/branches/nowhere", {"json": {"type": "reset"}}, "branch not found"),
    ("GET", "/branches/nowhere/diff", {}, "branch not found"),
    ("POST", "/branches/nowhere/revert", {"json": {"ref": "main", "parent_number": 0}}, "branch not found"),
    ("POST", "/branches/main/revert", {"json": {"ref": "nowhere", "parent_number": 0}}, "get commit from ref nowhere: not found"),
    ("PUT", "/branches/nowhere/hard_reset", {"params": {"ref": "main"}}, "branch not found"),
    ("PUT", "/branches/main/hard_reset", {"params": {"ref": "nowhere"}}, "hard-reset main to nowhere: not found"),
    ("DELETE", "/branches/nowhere/objects", {"params": {"path": "a"}}, "branch not found"),
    ("POST", "/branches/nowhere/objects", {"params": {"path": "a"}, "data": b"x", "headers": OCTET}, "branch 'nowhere' not found"),
    ("GET", "/refs/nowhere/objects", {"params": {"path": "a"}}, "not found"),
    ("GET", "/refs/main/objects", {"params": {"path": "absent"}}, "not found"),
    ("GET", "/refs/main/objects/stat", {"params": {"path": "absent"}}, "not found"),
    ("GET", "/refs/nowhere/objects/ls", {}, "not found"),
    ("GET", "/commits/" + "f" * 64, {}, "commit not found"),
    ("GET", "/commits/nowhere", {}, "commit not found"),
    ("GET", "/refs/nowhere/commits", {}, "ref: not found"),
    ("POST", "/refs/nowhere/merge/main", {"json": {}}, "update branch main: get commit by ref nowhere: not found"),
    ("GET", "/refs/nowhere/merge/main", {}, "get commit by branch nowhere: not found"),
    ("GET", "/refs/main/diff/nowhere", {}, "get commit by ref nowhere: not found"),
    ("POST", "/branches", {"json": {"name": "b2", "source": "nowhere"}}, "source reference 'nowhere': not found"),
    ("POST", "/tags", {"json": {"id": "t1", "ref": "nowhere"}}, "not found"),
    ("GET", "/tags/nope", {}, "tag not found"),
    ("DELETE", "/tags/nope", {}, "tag not found"),
]  # fmt: skip
HOOK_ABORTED = re.compile(
    r"prepare-commit hook aborted, run id '[a-z0-9]{20}': list actions from commit: listing actions: not found"
)


@pytest.mark.parametrize(
    ("method", "path", "options", "expected"), MISSING, ids=[f"{m} {p}" for m, p, *_ in MISSING]
)
def test_each_operation_answers_lakefs_404_message(repo: Repo, method, path, options, expected):
    answer = repo.call(method, path, **options)
    assert (answer.status_code, answer.json()) == (404, {"message": expected})


def test_a_commit_to_a_missing_branch_fails_in_its_prepare_commit_hooks(repo: Repo):
    answer = repo.commit("nowhere")
    assert answer.status_code == 404 and HOOK_ABORTED.fullmatch(answer.json()["message"]), answer.text


def test_a_missing_repository_is_404_whatever_the_operation(repo: Repo):
    other = Repo(repo.server, repo.name + "-gone")
    for answer in (other.call("GET"), other.call("GET", "/branches/main"), other.get_object("main", "a")):
        assert (answer.status_code, answer.json()) == (404, {"message": "repository not found"})


def test_deleting_many_objects_answers_200_with_its_errors_even_on_a_missing_branch(repo: Repo):
    assert repo.upload("main", "a", b"a").status_code == 201
    for branch in ("main", "nowhere"):
        answer = repo.call("POST", f"/branches/{branch}/objects/delete", json={"paths": ["a", "absent"]})
        assert (answer.status_code, answer.json()) == (200, {"errors": []}), (branch, answer.text)
    assert repo.uncommitted("main") == []  # "a" was staged, then deleted: nothing left to commit
