"""lakeFS's behaviour when two clients race on one branch, on the double and a real lakeFS.

The outcome of a race depends on which request the server takes first, so these tests assert
what must hold for every order: the answers are among the documented ones, and the state after
both is one of the orders' states. Same fixtures as ``test_lakefs_behaviour.py``.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.versioning import test_lakefs_behaviour as behaviour
from tests.versioning.lakefs_backends import LAKEFS_BACKENDS
from tests.versioning.lakefs_http import Repo, segment
from tests.versioning.test_lakefs_behaviour_errors import HOOK_ABORTED
from versioning import Commit, NotFound

server, repo = behaviour.server, behaviour.repo  # the same fixtures: the double and a real lakeFS

STAGED = 1000  # enough that the commit writes a metarange of its own for a while


def test_deleting_a_branch_while_it_commits_loses_neither_the_commit_nor_the_deletion(repo: Repo):
    # pkg/graveler/graveler.go Commit: the branch record is updated only if it is unchanged
    # since the commit began (a KV SetIf); DeleteBranch removes the record. Either the commit
    # lands first (201, and the commit stays readable by id after the branch is gone) or the
    # deletion does (the commit answers 404 or 409); the branch never comes back.
    assert repo.create_branch("doomed").status_code == 201
    with ThreadPoolExecutor(16) as pool:
        answers = pool.map(lambda i: repo.upload("doomed", f"staged/{i:05d}", b"x"), range(STAGED))
        assert {a.status_code for a in answers} == {201}
    commit_sent = threading.Event()
    outcome: dict = {}

    def commit() -> None:
        commit_sent.set()
        outcome["commit"] = repo.commit("doomed", "racing a deletion")

    committer = threading.Thread(target=commit)
    committer.start()
    commit_sent.wait()
    deleted = repo.call("DELETE", f"/branches/{segment('doomed')}")
    committer.join()
    committed = outcome["commit"]
    assert deleted.status_code == 204, deleted.text
    # Which answer depends on where the deletion lands: before the commit's prepare-commit hooks
    # list the branch's actions (their 404), before it reads the branch (404 "branch not
    # found"), or between that read and the branch's conditional update, where lakeFS v1.84.0
    # answers 500 "predicate failed" (kv.ErrPredicateFailed escapes as a 500). The double
    # serialises the two, so it answers 201 or one of the 404s.
    if committed.status_code == 404:
        text = committed.json()["message"]
        assert text == "branch not found" or HOOK_ABORTED.fullmatch(text), text
    elif committed.status_code != 201:
        assert (committed.status_code, committed.json()) == (500, {"message": "predicate failed"})
    assert repo.call("GET", f"/branches/{segment('doomed')}").status_code == 404
    if committed.status_code == 201:
        landed = repo.get_commit(committed.json()["id"])
        assert landed["message"] == "racing a deletion"
        listed = repo.list_objects(landed["id"], prefix="staged/", amount=1000).json()
        assert len(listed["results"]) == STAGED


@pytest.mark.parametrize("backend", ["lakefs-double", "lakefs-real"])
def test_the_adapter_reports_a_commit_that_lost_its_branch_as_not_found(backend: str, tmp_path: Path):
    # Whatever lakeFS answers the losing commit (404, or the 500 above, which the adapter retries
    # and then finds the branch gone), the caller sees the commit or NotFound, never a
    # TransientError after its retries, and no commit that is not there.
    with LAKEFS_BACKENDS[backend](tmp_path) as repo:
        repo.ensure()
        repo.create_branch("doomed", "main")
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: repo.put("doomed", f"staged/{i:05d}", b"x"), range(STAGED)))
        commit_sent = threading.Event()
        outcome: dict = {}

        def commit() -> None:
            commit_sent.set()
            try:
                outcome["commit"] = repo.commit("doomed", "racing a deletion")
            except NotFound as lost:
                outcome["commit"] = lost

        committer = threading.Thread(target=commit)
        committer.start()
        commit_sent.wait()
        repo.delete_branch("doomed")
        committer.join()
        assert "doomed" not in repo.list_branches()
        landed = outcome["commit"]
        assert isinstance(landed, (Commit, NotFound)), landed
        if isinstance(landed, Commit):
            assert repo.get(landed.id, "staged/00000") == b"x"
        else:
            assert "doomed" in str(landed), landed
