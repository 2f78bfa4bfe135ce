"""lakeFS's behaviour when two clients race on one branch, on the double and a real lakeFS.

The outcome of a race depends on which request the server takes first, so these tests assert
what must hold for every order: the answers are among the documented ones, and the state after
both is one of the orders' states. Same fixtures as ``test_lakefs_behaviour.py``.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from tests.versioning import test_lakefs_behaviour as behaviour
from tests.versioning.lakefs_http import Repo, segment

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
    assert committed.status_code in (201, 404, 409), committed.text
    assert repo.call("GET", f"/branches/{segment('doomed')}").status_code == 404
    if committed.status_code == 201:
        landed = repo.get_commit(committed.json()["id"])
        assert landed["message"] == "racing a deletion"
        listed = repo.list_objects(landed["id"], prefix="staged/", amount=1000).json()
        assert len(listed["results"]) == STAGED
