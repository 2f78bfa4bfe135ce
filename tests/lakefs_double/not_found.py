"""lakeFS's 404 messages, operation by operation, as lakeFS v1.84.0 answers them.

lakeFS builds each message from the layer that failed (``pkg/api/controller.go`` wrapping a
``graveler.ErrNotFound``), so the same missing ref reads differently per operation; the table was
read off a real lakeFS and is checked against it by
``tests/versioning/test_lakefs_behaviour_errors.py``. The double's own
messages would name its backing directory, which lakeFS's never do.
"""

from __future__ import annotations

import secrets
import string

from tests.lakefs_double.common import ApiError, Call
from versioning.port import RepoError

_BRANCH_FIRST = {
    "getBranch",
    "deleteBranch",
    "resetBranch",
    "diffBranch",
    "revertBranch",
    "hardResetBranch",
    "deleteObject",
}
_PLAIN = {"getObject", "statObject", "headObject", "listObjects", "createTag"}
_RUN_ID_ALPHABET = string.ascii_lowercase + "0123456789"


def lakefs_not_found(call: Call) -> str:
    """What lakeFS answers ``call`` when a repository, ref or object it names is missing."""
    try:
        repo = call.repo
    except ApiError:
        return "repository not found"
    op, params = call.op.operation_id, call.path_params

    def missing(ref: str) -> bool:
        try:
            repo.resolve(ref)
        except RepoError:
            return True
        return False

    if op in ("getRepository", "deleteRepository"):
        return "repository not found"
    if op in _BRANCH_FIRST and missing(params["branch"]):
        return "branch not found"
    if op in _PLAIN:
        return "not found"
    if op in ("getTag", "deleteTag"):
        return "tag not found"
    if op == "getCommit":
        return "commit not found"
    if op == "logCommits":
        return "ref: not found"
    if op == "uploadObject":
        return f"branch {params['branch']!r} not found"
    if op == "commit":
        # The commit runs its prepare-commit hooks first, which list the branch's actions.
        run_id = "".join(secrets.choice(_RUN_ID_ALPHABET) for _ in range(20))
        return f"prepare-commit hook aborted, run id {run_id!r}: list actions from commit: listing actions: not found"
    if op == "createBranch":
        return f"source reference {call.body_field('source')!r}: not found"
    if op == "revertBranch":
        return f"get commit from ref {call.body_field('ref')}: not found"
    if op == "hardResetBranch":
        return f"hard-reset {params['branch']} to {call.arg('ref')}: not found"
    if op == "mergeIntoBranch":
        return (
            f"update branch {params['destinationBranch']}: get commit by ref {params['sourceRef']}: not found"
        )
    if op == "diffRefs":
        ref = params["leftRef"] if missing(params["leftRef"]) else params["rightRef"]
        return f"get commit by ref {ref}: not found"
    if op == "findMergeBase":
        ref = params["sourceRef"] if missing(params["sourceRef"]) else params["destinationBranch"]
        return f"get commit by branch {ref}: not found"
    return "not found"
