"""The double's handlers for server config, repositories, branches, tags and history."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

from tests.lakefs_double.common import (
    ApiError,
    Call,
    Reply,
    after_marker,
    not_implemented,
    operation,
    page,
    ref_json,
    split_metadata,
)
from versioning.local import LocalRepo
from versioning.port import Change, HookFailed, MergeConflict, validate_branch, validate_tag

VERSION = "1.84.0"
# The local block adapter's namespace rule (pkg/block/local); the spec's own pattern is wider.
_NAMESPACE = re.compile(r"^local://")
# pkg/graveler/graveler.go: every merge commit records its strategy under this key.
MERGE_STRATEGY_KEY = ".lakefs.merge.strategy"
STORAGE_CONFIG = {
    "blockstore_type": "local",
    "blockstore_namespace_example": "local://example-bucket/",
    "blockstore_namespace_ValidityRegex": "^local://",
    "pre_sign_support": False,
    "pre_sign_support_ui": False,
    "import_support": False,
    "import_validity_regex": "^local://",
}


# server


@operation("healthCheck")
def health_check(call: Call) -> Reply:
    return Reply(204)


@operation("getConfig")
def get_config(call: Call) -> Reply:
    return Reply(200, json={"storage_config": STORAGE_CONFIG, "version_config": {"version": VERSION}})


@operation("getStorageConfig")
def get_storage_config(call: Call) -> Reply:
    return Reply(200, json=STORAGE_CONFIG)


@operation("getLakeFSVersion")
def get_version(call: Call) -> Reply:
    return Reply(200, json={"version": VERSION})


# repositories


@operation("listRepositories")
def list_repositories(call: Call) -> Reply:
    prefix = call.arg("prefix") or ""
    infos = (info.to_json() for info in call.store.all() if info.name.startswith(prefix))
    return Reply(200, json=page(infos, lambda r: r["id"], call.arg("after") or "", call.amount()))


@operation("createRepository")
def create_repository(call: Call) -> Reply:
    if call.flag("bare"):
        raise not_implemented("creating a bare repository")
    name, namespace = call.body_field("name"), call.body_field("storage_namespace")
    if not isinstance(name, str) or not isinstance(namespace, str):
        raise ApiError(400, "name and storage_namespace are required")
    if not _NAMESPACE.match(namespace):
        # pkg/api/controller.go validateStorageNamespace: the block store's validity regex.
        raise ApiError(400, f"failed to match required regex {_NAMESPACE.pattern}: invalid namespace")
    default_branch = call.body_field("default_branch") or "main"
    info = call.store.create(name, namespace, validate_branch(default_branch))
    return Reply(201, json=info.to_json())


@operation("getRepository")
def get_repository(call: Call) -> Reply:
    return Reply(200, json=call.info.to_json())


@operation("deleteRepository")
def delete_repository(call: Call) -> Reply:
    call.store.delete(call.path_params["repository"])
    return Reply(204)


# branches


@operation("listBranches")
def list_branches(call: Call) -> Reply:
    prefix = call.arg("prefix") or ""
    refs = (ref_json(n, c) for n, c in sorted(call.repo.list_branches().items()) if n.startswith(prefix))
    return Reply(200, json=page(refs, lambda r: r["id"], call.arg("after") or "", call.amount()))


@operation("createBranch")
def create_branch(call: Call) -> Reply:
    name, source = call.body_field("name"), call.body_field("source")
    if not isinstance(name, str) or not isinstance(source, str):
        raise ApiError(400, "name and source are required")
    commit_id = call.repo.create_branch(name, source)
    return Reply(201, body=commit_id.encode(), content_type="text/html")


@operation("getBranch")
def get_branch(call: Call) -> Reply:
    branch = validate_branch(call.path_params["branch"])
    heads = call.repo.list_branches()
    if branch not in heads:
        raise ApiError(404, f"branch {branch!r} not found")
    return Reply(200, json=ref_json(branch, heads[branch]))


@operation("deleteBranch")
def delete_branch(call: Call) -> Reply:
    branch = call.path_params["branch"]
    if branch == call.info.default_branch:
        raise ApiError(403, "cannot delete repository default branch")
    call.repo.delete_branch(branch)
    return Reply(204)


@operation("resetBranch")
def reset_branch(call: Call) -> Reply:
    if call.body_field("type") != "reset":
        raise not_implemented("resetting one object or prefix")
    call.repo.discard_uncommitted(call.path_params["branch"])
    return Reply(204)


@operation("hardResetBranch")
def hard_reset_branch(call: Call) -> Reply:
    # pkg/graveler/graveler.go ResetHard refuses only sealed (mid-commit) staging, which
    # LocalRepo never has: the branch moves and its staged changes stay.
    call.repo.reset_hard(call.path_params["branch"], call.required("ref"))
    return Reply(204)


@operation("diffBranch")
def diff_branch(call: Call) -> Reply:
    if call.arg("delimiter"):
        raise not_implemented("diff with a delimiter")
    changes = uncommitted(call.repo, call.path_params["branch"], call.arg("prefix") or "")
    return diff_page(call, call.path_params["branch"], changes)


def uncommitted(repo: LocalRepo, branch: str, prefix: str = "") -> list[Change]:
    """The staged changes of ``branch``: its listing against its head commit's."""
    staged = {s.path: s.checksum for s in repo.list(branch, prefix)}
    committed = {s.path: s.checksum for s in repo.list(repo.resolve(branch), prefix)}
    changes = [
        Change(path, "added" if path not in committed else "removed" if path not in staged else "changed")
        for path in staged.keys() | committed.keys()
        if staged.get(path) != committed.get(path)
    ]
    return sorted(changes, key=lambda c: c.path)


# tags


@operation("listTags")
def list_tags(call: Call) -> Reply:
    prefix = call.arg("prefix") or ""
    refs = (ref_json(n, c) for n, c in sorted(call.repo.list_tags().items()) if n.startswith(prefix))
    return Reply(200, json=page(refs, lambda r: r["id"], call.arg("after") or "", call.amount()))


@operation("createTag")
def create_tag(call: Call) -> Reply:
    tag, ref = call.body_field("id"), call.body_field("ref")
    if not isinstance(tag, str) or not isinstance(ref, str):
        raise ApiError(400, "id and ref are required")
    return Reply(201, json=ref_json(tag, call.repo.create_tag(tag, ref)))


@operation("getTag")
def get_tag(call: Call) -> Reply:
    tag = validate_tag(call.path_params["tag"])
    tags = call.repo.list_tags()
    if tag not in tags:
        raise ApiError(404, f"tag {tag!r} not found")
    return Reply(200, json=ref_json(tag, tags[tag]))


@operation("deleteTag")
def delete_tag(call: Call) -> Reply:
    call.repo.delete_tag(call.path_params["tag"])
    return Reply(204)


# commits and history


@operation("commit")
def commit(call: Call) -> Reply:
    if call.arg("source_metarange") or call.body_field("date") is not None:
        raise not_implemented("committing a metarange or with a date")
    message = call.body_field("message")
    if not isinstance(message, str):
        raise ApiError(400, "message is required")
    metadata, reserved = split_metadata(call.body_field("metadata"))
    created = call.repo.commit(
        call.path_params["branch"], message, metadata, bool(call.body_field("allow_empty"))
    )
    call.remember_reserved(created.id, reserved)
    return Reply(201, json=call.commit_json(created))


@operation("getCommit")
def get_commit(call: Call) -> Reply:
    return Reply(200, json=call.commit_json(call.repo.get_commit(call.path_params["commitId"])))


@operation("logCommits")
def log_commits(call: Call) -> Reply:
    unsupported = ("objects", "prefixes", "first_parent", "since", "stop_at")
    if any(call.arg(name) for name in unsupported):
        raise not_implemented(f"log filters ({', '.join(unsupported)})")
    commits = after_marker(call.repo.log(call.path_params["ref"]), lambda c: c.id, call.arg("after") or "")
    listing = page((call.commit_json(c) for c in commits), lambda c: c["id"], "", call.amount())
    if call.flag("limit"):
        listing["pagination"].update(has_more=False, next_offset="")
    return Reply(200, json=listing)


@operation("diffRefs")
def diff_refs(call: Call) -> Reply:
    if call.arg("delimiter"):
        raise not_implemented("diff with a delimiter")
    repo, left, right = call.repo, call.path_params["leftRef"], call.path_params["rightRef"]
    if (call.arg("type") or "three_dot") == "three_dot":
        left = merge_base(repo, left, right)
    return diff_page(call, right, repo.diff(left, right, call.arg("prefix") or ""), removed_from=left)


def diff_page(call: Call, right: str, changes: list[Change], removed_from: str | None = None) -> Reply:
    repo = call.repo
    left = removed_from or repo.resolve(right)

    def entry(change: Change) -> dict[str, object]:
        if change.kind == "removed" and removed_from is None:
            size = 0  # an uncommitted removal is a tombstone in staging: lakeFS reports no size
        else:
            size = repo.stat(left if change.kind == "removed" else right, change.path).size
        return {"type": change.kind, "path": change.path, "path_type": "object", "size_bytes": size}

    listing = page(changes, lambda c: c.path, call.arg("after") or "", call.amount())
    listing["results"] = [entry(change) for change in listing["results"]]
    return Reply(200, json=listing)


@operation("findMergeBase")
def find_merge_base(call: Call) -> Reply:
    repo, source, destination = (
        call.repo,
        call.path_params["sourceRef"],
        call.path_params["destinationBranch"],
    )
    return Reply(
        200,
        json={
            "source_commit_id": repo.resolve(source),
            "destination_commit_id": repo.resolve(destination),
            "base_commit_id": merge_base(repo, source, destination),
        },
    )


def merge_base(repo: LocalRepo, left: str, right: str) -> str:
    """The best common ancestor: one that no other common ancestor descends from (newest on ties)."""
    theirs = {c.id: c for c in repo.log(left)}
    common = [c for c in repo.log(right) if c.id in theirs]
    if not common:
        raise ApiError(404, "no merge base")
    ancestors_of_others = set()
    for candidate in common:
        ancestors_of_others.update(_strict_ancestors(theirs, candidate.id))
    best = [c for c in common if c.id not in ancestors_of_others]
    return max(best, key=lambda c: c.created).id


def _strict_ancestors(commits: dict, start: str) -> Iterator[str]:
    stack, seen = list(commits[start].parents), set()
    while stack:
        cid = stack.pop()
        if cid in seen:
            continue
        seen.add(cid)
        yield cid
        stack.extend(commits[cid].parents)


_LOCAL_HOOK_REFUSAL = re.compile(
    r"^pre-merge hook aborted: action (?P<action>'[^']*') hook (?P<hook>'[^']*')[: ]+(?P<why>.*)$", re.S
)


def lakefs_hook_refusal(destination: str, local_message: str) -> str:
    """The local repository's refusal in the envelope lakeFS v1.84.0 sends with its 412
    (pkg/graveler/graveler.go ErrHookAborted around pkg/actions/service.go's multierror, checked
    against the real server by tests/versioning/test_lakefs_hook_real.py)."""
    found = _LOCAL_HOOK_REFUSAL.match(local_message)
    action, hook, why = (
        (found["action"], found["hook"], found["why"]) if found else ("'?'", "'?'", local_message)
    )
    run_id = uuid.uuid4().hex[:20]
    return (
        f"update branch {destination}: pre-merge hook aborted, run id '{run_id}': 1 error occurred:\n"
        f"\t* hook run id '0000_0000' failed on action {action} hook {hook}: action failed: {why}\n\n"
    )


@operation("mergeIntoBranch")
def merge_into_branch(call: Call) -> Reply:
    if call.body_field("strategy") or call.body_field("squash_merge") or call.body_field("allow_empty"):
        raise not_implemented("merge strategies, squash and empty merges")
    repo, source, destination = (
        call.repo,
        call.path_params["sourceRef"],
        call.path_params["destinationBranch"],
    )
    metadata, reserved = split_metadata(call.body_field("metadata"))
    try:
        merged = repo.merge(source, destination, call.body_field("message") or "", metadata)
    except MergeConflict:
        # lakeFS answers a conflict with an empty MergeResult and does not name the paths.
        return Reply(409, json={"reference": ""})
    except HookFailed as refused:
        raise ApiError(412, lakefs_hook_refusal(destination, str(refused))) from None
    call.remember_reserved(merged, {**reserved, MERGE_STRATEGY_KEY: "default"})
    return Reply(200, json={"reference": merged})


@operation("revertBranch")
def revert_branch(call: Call) -> Reply:
    overrides = call.body_field("commit_overrides") or {}
    if overrides.get("message") or call.body_field("allow_empty"):
        raise not_implemented("reverting with a message override or allow_empty")
    repo, branch, ref = call.repo, call.path_params["branch"], call.body_field("ref") or ""
    reverted = repo.get_commit(ref)
    parent_number = call.body_field("parent_number") or 0
    if parent_number < 0:
        raise ApiError(400, "argument parentNumber: invalid value: validation error")
    if parent_number == 0:
        if len(reverted.parents) > 1:
            raise ApiError(409, "must specify 1-based parent number for reverting merge commit")
        parent_number = 1
    metadata, reserved = split_metadata(overrides.get("metadata"))
    reverting = repo.revert(branch, ref, parent_number, metadata)  # its message names ``ref`` as given
    call.remember_reserved(reverting.id, reserved)
    return Reply(204)
