"""Write-audit-publish on the dataset repository: run branches, the publish lock, publishing.

* A curate run writes on its own branch ``curate-<flow run id>`` created from ``main``
  (lakeFS forbids ``/`` in branch names). The flow-run id in the name is how the janitor
  finds the run that owns a branch.
* Publishing merges the run's last commit into ``main`` and tags the merge commit
  ``ds-<YYYYMMDD>-<n>``. The merge commit's metadata records the stage chain (stage, cache
  key, commit), so a later run can tell which stage outputs ``main`` already holds.
* A run branch is published only while ``main`` has not moved since the run branched (its
  head is an ancestor of the run's head): otherwise :class:`MainMoved` names what moved it
  (another run's publish, a rollback) and nothing is merged.
* Publishing holds a lock: the branch ``lock-publish``, whose creation is atomic in both
  adapters, created at a commit that already names the holder (made first on the run's own
  ``curate-<flow run id>-lock`` branch, deleted once the lock is taken), so a process killed
  at any moment never leaves a lock without a holder to judge. A rollback (``flows/rollback.py``) must
  refuse while :func:`publish_in_progress` returns a holder. A lock whose holder's process is
  gone from this host (killed inside its publish) is taken over by the next publisher; one
  held from another host is freed by ``tokenlake janitor`` there.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from flows import publish_guard
from flows.notices import notice
from flows.refusals import Refusal
from formats import layout
from formats.layout import DATASET_TAG_PREFIX as TAG_PREFIX
from formats.layout import MAIN, PUBLISH_LOCK_BRANCH, PUBLISH_STAGE, RUN_BRANCH_PREFIX
from formats.rollbacks import restored_from
from tasks.stage import tokenlake_version
from versioning import Commit, Conflict, DataRepo, NoChanges, NotFound
from versioning.liveness import process_alive

LOCK_CANDIDATE_SUFFIX = "-lock"


@Refusal.register
class PublishBusy(RuntimeError):
    """Another publish holds the lock."""


@Refusal.register
class MainMoved(RuntimeError):
    """``main`` moved (another publish, a rollback) after the run branched from it."""


def run_branch(flow_run_id: str) -> str:
    return f"{RUN_BRANCH_PREFIX}{flow_run_id}"


def lock_candidate_branch(flow_run_id: str) -> str:
    """Where a publisher writes its holder commit before pointing the lock at it."""
    return f"{RUN_BRANCH_PREFIX}{flow_run_id}{LOCK_CANDIDATE_SUFFIX}"


def flow_run_of_branch(branch: str) -> str | None:
    """The flow run that owns a run branch or its lock candidate; None for any other branch."""
    if not branch.startswith(RUN_BRANCH_PREFIX):
        return None
    return branch.removeprefix(RUN_BRANCH_PREFIX).removesuffix(LOCK_CANDIDATE_SUFFIX)


def open_run_branch(repo: DataRepo, branch: str) -> str:
    """Create ``branch`` at main's head and return that commit id.

    A retried flow run (same id) may find its branch left by a killed attempt: it starts
    over from main's head, without the killed attempt's uncommitted writes (a hard reset
    keeps them, as in lakeFS; no one else writes to a run's branch); the killed attempt's
    finished stages come back from the cache. A repository that holds no dataset version yet
    first gets the publish guard on main (:mod:`flows.publish_guard`), so that lakeFS and the
    local repository refuse ungated merges from the start; an older repository gets it from
    ``tokenlake repo install-hooks``.
    """
    if not any(tag.startswith(TAG_PREFIX) for tag in repo.list_tags()):
        publish_guard.install(repo, MAIN)
    try:
        return repo.create_branch(branch, MAIN)
    except Conflict:
        head = repo.resolve(MAIN)
        repo.discard_uncommitted(branch)
        repo.reset_hard(branch, head)
        return head


@dataclass(frozen=True)
class ChainLink:
    """One stage of a published version: its cache key and the commit that ended it."""

    stage: str
    key: str
    commit: str


@dataclass(frozen=True)
class PublishRecord:
    """What a publish merge commit says about the version it made."""

    commit: str
    tag: str
    run_head: str
    flow_run_id: str
    chain: tuple[ChainLink, ...]

    @classmethod
    def from_commit(cls, commit: Commit) -> PublishRecord | None:
        meta = commit.metadata
        if meta.get("stage") != PUBLISH_STAGE or "chain" not in meta:
            return None
        chain = tuple(ChainLink(**link) for link in json.loads(meta["chain"]))
        return cls(
            commit.id, meta.get("tag", ""), meta.get("input_commit", ""), meta.get("flow_run_id", ""), chain
        )

    def link(self, stage: str) -> ChainLink | None:
        return next((link for link in self.chain if link.stage == stage), None)


@dataclass(frozen=True)
class PublishedVersion:
    """What a curate run returns: the dataset version ``main`` now holds."""

    tag: str
    commit_id: str
    new: bool  # False when main already held exactly this data (nothing merged)

    def __str__(self) -> str:
        state = "published" if self.new else "already published"
        return f"{state} {self.tag} at commit {self.commit_id}"


def publish_in_progress(repo: DataRepo) -> dict[str, str] | None:
    """The publish lock's holder (flow_run_id, host, pid, since), or None when no publish runs."""
    held = _lock_held(repo)
    return held[1] if held else None


def _lock_held(repo: DataRepo) -> tuple[str, dict[str, str]] | None:
    """(the lock branch's head commit, its holder), or None when no publish runs."""
    lock_commit = repo.list_branches().get(PUBLISH_LOCK_BRANCH)
    if lock_commit is None:
        return None
    meta = repo.get_commit(lock_commit).metadata
    if meta.get("stage") != "lock":
        return lock_commit, {
            "flow_run_id": "",
            "host": "",
            "pid": "",
            "since": "",
        }  # created, holder not yet written
    return lock_commit, {k: meta.get(k, "") for k in ("flow_run_id", "host", "pid", "since")}


def _holder_dead(holder: dict[str, str]) -> bool:
    """True only when the holder's process is provably gone: it ran on this host and its pid is
    free (or reused by a process started after it took the lock). A holder on another host, or
    one not yet written, is never judged dead here."""
    try:
        since = datetime.fromisoformat(holder["since"]) if holder["since"] else None
    except ValueError:
        since = None
    return process_alive(f"{holder['host']}:{holder['pid']}", since) is False


def _take_over_dead_lock(repo: DataRepo, lock_commit: str, holder: dict[str, str]) -> None:
    """Delete the lock a killed publisher left (its process gone, so it never releases it), unless
    the lock changed since it was judged. A killed ``tokenlake curate`` whose re-run waited for it
    would otherwise fail with PublishBusy until someone ran the janitor.

    Each publisher deletes only while the lock is still ``lock_commit``: one that judged the same
    dead lock later finds the first's new lock (another commit) and waits for it. The check and
    the delete are two calls (neither adapter deletes a branch conditionally), so two publishers
    on this host judging one dead lock within the same few milliseconds could still both go on."""
    if repo.list_branches().get(PUBLISH_LOCK_BRANCH) != lock_commit:
        return
    notice(
        f"publish lock of flow run {holder['flow_run_id']} (process {holder['pid']} on {holder['host']}) "
        "is held by a dead process; taking it over"
    )
    _delete_if_present(repo, PUBLISH_LOCK_BRANCH)  # the janitor may have freed it meanwhile


def _delete_if_present(repo: DataRepo, branch: str) -> None:
    try:
        repo.delete_branch(branch)
    except NotFound:
        pass


def _take_lock(repo: DataRepo, flow_run_id: str) -> None:
    """Create ``lock-publish`` at a commit naming this process (Conflict when it exists). The
    holder commit is made on this run's candidate branch first: creating the lock branch is the
    one atomic step, so the lock never exists without its holder."""
    candidate = lock_candidate_branch(flow_run_id)
    _delete_if_present(repo, candidate)  # left by a killed attempt of this flow run
    repo.create_branch(candidate, MAIN)
    try:
        holder = {
            "stage": "lock",
            "flow_run_id": flow_run_id,
            "host": socket.gethostname(),
            "pid": str(os.getpid()),
            "since": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        commit = repo.commit(
            candidate, f"publish lock held by flow run {flow_run_id}", holder, allow_empty=True
        )
        repo.create_branch(PUBLISH_LOCK_BRANCH, commit.id)
    finally:
        _delete_if_present(repo, candidate)


@contextmanager
def publish_lock(
    repo: DataRepo, flow_run_id: str, wait_s: float = 120.0, poll_s: float = 0.5
) -> Iterator[None]:
    """Hold ``lock-publish`` for the block; re-entrant for the same flow run (a retried task)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            _take_lock(repo, flow_run_id)
            break
        except Conflict:
            held = _lock_held(repo)
            holder = held[1] if held else None
            if holder and holder["flow_run_id"] == flow_run_id:
                break  # our own earlier attempt took it
            if held and _holder_dead(held[1]):
                _take_over_dead_lock(repo, *held)
                continue
            if time.monotonic() > deadline:
                who = holder["flow_run_id"] if holder else "unknown"
                raise PublishBusy(
                    f"another publish holds the lock (flow run {who or 'unknown'}); wait for it, or run "
                    "`tokenlake janitor` if that run is dead"
                ) from None
            time.sleep(poll_s)
    try:
        yield
    finally:
        _delete_if_present(repo, PUBLISH_LOCK_BRANCH)


def published_record(repo: DataRepo, ref: str, depth: int = 16) -> PublishRecord | None:
    """The publish whose content ``ref`` holds: ``ref`` itself when it is a publish merge, or, for a
    rollback's own commits (``main``'s head after a rollback), the version that rollback restored."""
    commit = repo.get_commit(ref)
    for _ in range(depth):
        record = PublishRecord.from_commit(commit)
        source = "" if record else restored_from(repo, commit.metadata)
        if not source:
            return record
        commit = repo.get_commit(source)
    return None


def tags_of(repo: DataRepo, commit_id: str) -> list[str]:
    return sorted(t for t, c in repo.list_tags().items() if c == commit_id and t.startswith(TAG_PREFIX))


def next_tag(repo: DataRepo, now: datetime | None = None) -> str:
    day = (now or datetime.now(UTC)).strftime("%Y%m%d")
    prefix = f"{TAG_PREFIX}{day}-"
    taken = [
        int(t[len(prefix) :]) for t in repo.list_tags() if t.startswith(prefix) and t[len(prefix) :].isdigit()
    ]
    return f"{prefix}{max(taken, default=0) + 1}"


def _merged_by(repo: DataRepo, run_head: str, limit: int = 50) -> PublishRecord | None:
    """The publish on main that merged ``run_head`` (a retried publish finds its own merge)."""
    for commit in repo.log(MAIN, limit=limit):
        record = PublishRecord.from_commit(commit)
        if record and record.run_head == run_head:
            return record
    return None


def publish(
    repo: DataRepo,
    run_head: str,
    chain: list[ChainLink],
    flow_run_id: str,
    gates_hash: str,
) -> PublishedVersion:
    """Merge ``run_head`` into main and tag it; idempotent, so a retried task never publishes twice.

    Called once the flow's publish gates held (``flows.curate.check_gates``, in the publish task). The merge commit
    records that (``gate``), and each stage commit's own gate (``gates``), for the commit it merges
    (``input_commit``): what the publish guard's pre-merge hook requires.
    """
    with publish_lock(repo, flow_run_id):
        done = _merged_by(repo, run_head)
        if done:
            if done.tag not in repo.list_tags():
                repo.create_tag(done.tag, done.commit)
            return PublishedVersion(done.tag, done.commit, new=done.flow_run_id == flow_run_id)
        main_head = repo.resolve(MAIN)
        if not repo.diff(main_head, run_head):
            return _already_on_main(repo, main_head)
        if not repo.is_ancestor(main_head, run_head):
            # The gates checked the run branch as it is; merging it into a main that has moved
            # would publish a mixture of two versions that nobody checked together.
            raise MainMoved(
                f"main moved while this run was curating: {_describe(repo, main_head)}; nothing was merged, "
                "run curate again to build on it"
            )
        tag = next_tag(repo)
        metadata = {
            "stage": PUBLISH_STAGE,
            "stage_config_hash": gates_hash,
            "input_commit": run_head,
            "flow_run_id": flow_run_id,
            "tokenlake_version": tokenlake_version(),
            "tag": tag,
            "chain": json.dumps([asdict(link) for link in chain]),
            "gate": "passed",
            "gates": json.dumps(stage_gates(repo, chain), sort_keys=True),
        }
        try:
            merged = repo.merge(run_head, MAIN, f"publish {tag}", metadata)
        except NoChanges:
            return _already_on_main(repo, repo.resolve(MAIN))
        repo.create_tag(tag, merged)
        return PublishedVersion(tag, merged, new=True)


def _describe(repo: DataRepo, commit_id: str) -> str:
    """What made ``commit_id``, in words a user can look up."""
    commit = repo.get_commit(commit_id)
    record = PublishRecord.from_commit(commit)
    if record is not None:
        return f"flow run {record.flow_run_id} published {record.tag} (commit {commit_id[:12]})"
    meta = commit.metadata
    if meta.get("rollback"):
        return f"flow run {meta.get('flow_run_id', 'unknown')} rolled it back ({meta['rollback']}, commit {commit_id[:12]})"
    return f"commit {commit_id[:12]} ({commit.message})"


def stage_gates(repo: DataRepo, chain: list[ChainLink]) -> dict[str, str]:
    """Each gated stage's verdict, as its commit records it (``gate``: passed, failed or disabled)."""
    gates = {}
    for link in chain:
        verdict = repo.get_commit(link.commit).metadata.get("gate")
        if verdict is not None:
            gates[link.stage] = verdict
    return gates


def _already_on_main(repo: DataRepo, main_head: str) -> PublishedVersion:
    tags = tags_of(repo, main_head)
    if tags:
        return PublishedVersion(tags[-1], main_head, new=False)
    held = published_record(repo, main_head)  # main's head is a rollback's commit: the version it restored
    if held is not None and held.tag in repo.list_tags() and not repo.diff(held.commit, main_head):
        return PublishedVersion(held.tag, held.commit, new=False)
    tag = next_tag(repo)
    repo.create_tag(tag, main_head)
    return PublishedVersion(tag, main_head, new=True)


@dataclass(frozen=True)
class DatasetVersion:
    """One published version, as `tokenlake datasets` lists it."""

    tag: str
    commit_id: str
    created: str
    flow_run_id: str
    documents: dict[str, int]  # per source, after dedup: the version's documents
    tokens: dict[str, int]  # per source, stored in the shards
    documents_in_shards: dict[str, int]  # per source, ending in a stored sequence (`shards verify` counts)


def list_versions(repo: DataRepo) -> list[DatasetVersion]:
    """Every ``ds-*`` tag, newest first, with documents and tokens per source."""
    versions = []
    for tag, commit_id in repo.list_tags().items():
        if not tag.startswith(TAG_PREFIX):
            continue
        commit = repo.get_commit(commit_id)
        versions.append(
            DatasetVersion(
                tag=tag,
                commit_id=commit_id,
                created=datetime.fromtimestamp(commit.created, UTC).isoformat(timespec="seconds"),
                flow_run_id=commit.metadata.get("flow_run_id", ""),
                documents=documents_per_source(repo, commit_id),
                tokens=_tokens_per_source(repo, commit_id),
                documents_in_shards=_documents_in_shards(repo, commit_id),
            )
        )
    return sorted(versions, key=lambda v: (v.created, v.tag), reverse=True)


def _tokens_per_source(repo: DataRepo, ref: str) -> dict[str, int]:
    try:
        manifest = json.loads(repo.get(ref, layout.MANIFEST))
    except NotFound:
        return {}
    return {
        source: int(stats.get("tokens", 0)) for source, stats in sorted(manifest.get("sources", {}).items())
    }


def _documents_in_shards(repo: DataRepo, ref: str) -> dict[str, int]:
    """End-of-document tokens per source in the manifest's shards (what `shards verify` counts)."""
    try:
        manifest = json.loads(repo.get(ref, layout.MANIFEST))
    except NotFound:
        return {}
    counts: dict[str, int] = {}
    for shard in manifest.get("shards", []):
        counts[shard["source"]] = counts.get(shard["source"], 0) + int(shard.get("documents", 0))
    return dict(sorted(counts.items()))


def documents_per_source(repo: DataRepo, ref: str) -> dict[str, int]:
    """Documents that reached the shards: the dedup stage's kept count per source."""
    try:
        report = json.loads(repo.get(ref, layout.report_path("dedup")))
    except NotFound:
        return {}
    return {
        source: int(stats.get("kept", 0)) for source, stats in sorted(report.get("per_source", {}).items())
    }
