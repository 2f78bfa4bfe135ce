"""``main`` guarded by the repository itself: a lakeFS pre-merge action whose Lua hook refuses a
merge into ``main`` unless it records every stage gate of the curate flow as passed.

The curate flow checks its gates before it publishes; the guard makes the repository refuse an
ungated merge from any other client too (lakectl, the lakeFS UI, another script). The action
and its script live in the repository, where lakeFS reads them:

    _lakefs_actions/tokenlake_publish_guard.yaml   (action.yaml here)
    _tokenlake/hooks/publish_gates.lua             (publish_gates.lua here: the rule, documented)

lakeFS loads actions and ``script_path`` from the merge's *source* commit, so a branch must be
created from a ``main`` that holds them; the local repository runs the same Lua the same way
(``versioning/local/actions.py``). The record the hook checks is what :func:`flows.wap.publish`
writes into the merge commit's metadata: ``input_commit``, ``gate`` and ``gates``.
"""

from __future__ import annotations

from importlib.resources import files

import yaml

from formats.layout import MAIN as GUARDED_BRANCH
from formats.layout import PUBLISH_GUARD_ACTION as ACTION_PATH
from formats.layout import PUBLISH_GUARD_SCRIPT as SCRIPT_PATH
from tasks.stage import tokenlake_version
from versioning import DataRepo, NotFound

INSTALL_STAGE = "install-hooks"


def guard_files() -> dict[str, bytes]:
    """Repository path -> bytes of every file the guard consists of."""
    here = files(__package__)
    return {
        ACTION_PATH: (here / "action.yaml").read_bytes(),
        SCRIPT_PATH: (here / "publish_gates.lua").read_bytes(),
    }


def gated_stages() -> list[str]:
    """The stages whose gate the installed action requires to have passed."""
    action = yaml.safe_load(guard_files()[ACTION_PATH])
    return list(action["hooks"][0]["properties"]["args"]["gated_stages"])


def missing_files(repo: DataRepo, ref: str = GUARDED_BRANCH) -> list[str]:
    """Guard files absent at ``ref`` or different from this version's."""
    missing = []
    for path, data in guard_files().items():
        try:
            if repo.get(ref, path) != data:
                missing.append(path)
        except NotFound:
            missing.append(path)
    return missing


def install(repo: DataRepo, branch: str = GUARDED_BRANCH) -> str | None:
    """Upload the action and its script to ``branch`` and commit them; returns the commit id, or
    None when ``branch`` already holds this version of the guard."""
    missing = missing_files(repo, branch)
    if not missing:
        return None
    files_ = guard_files()
    for path in missing:
        repo.put(branch, path, files_[path])
    metadata = {"stage": INSTALL_STAGE, "tokenlake_version": tokenlake_version(), "paths": ",".join(missing)}
    return repo.commit(branch, "install the tokenlake publish guard (lakeFS pre-merge action)", metadata).id
