"""StageRunner: runs the stages of one curate run in order and decides which finished stages to reuse.

A stage's cache key is (stage, input commit id, stage-config hash, code version)
(:mod:`flows.caching`); ingest's input is the source files, fingerprinted. A cached result
names the commit that ended the stage. It is reused only where that is exact:

* **in place**: ``main``'s head is a version published with the same key for this stage and
  for every earlier one (the publish commit records the chain of keys), or a rollback's
  commit that restored such a version. The run branch, created from ``main``, already holds
  those outputs and stays where it is. So a re-run with no change reuses every stage and
  publishes nothing new (it returns the version's tag), and a run that changes one stage's
  config or code re-runs that stage and the later ones only, on top of the published version.
* **fast-forward**: the run branch's head is an ancestor of the cached commit (a retried flow
  run, or a re-run after a crash, while ``main`` has not moved): the branch moves to it.
* otherwise the stage runs again (**refresh**) and its cache entry is replaced.

Prefect performs the lookup itself (the task run shows as Cached); the decision only chooses
between letting it and forcing a refresh, and seeds the cache from the published chain when
the cache directory does not have the entry (another machine, a wiped cache). The decision is
bookkeeping of the flow, not a task of its own, so the run's task list and graph show the
stages (repository calls retry transient errors in the adapter).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect.client.orchestration import get_client
from prefect.context import get_run_context

from flows.artifacts import RunProgress, StageRun
from flows.caching import (
    StageCachePolicy,
    cached_stage_result,
    commit_exists,
    results_dir,
    seed_stage_result,
    stage_cache_key,
)
from flows.params import CurateParams
from flows.wap import ChainLink, PublishRecord, published_record, run_branch
from formats import layout
from tasks.stage import StageResult
from tasks.stage_task import leave_stage_table, retry_transient
from versioning import default_repo_spec, open_repo


@dataclass(frozen=True)
class RunStart:
    """Where a run starts: main's head, and what that version was published from (if it was)."""

    head: str
    previous: PublishRecord | None


def register_process(flow_run_id: str) -> None:
    """Record ``host:pid`` on the flow run, so the janitor can tell a killed run from a live one."""
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
        if not run.infrastructure_pid:  # a runner (serve, workers) sets its own
            client.update_flow_run(flow_run_id, infrastructure_pid=f"{socket.gethostname()}:{os.getpid()}")


@dataclass
class StageRunner:
    """One run between its stages: where it writes, what it reused, the chain of keys it publishes."""

    repo_spec: str
    branch: str
    flow_run_id: str
    results_dir: Path
    retry_options: dict[str, Any]
    head: str = ""  # main's head when the run started: the ingest stage's base
    previous: PublishRecord | None = None  # main's head, when that is a published version
    on_published_chain: bool = False  # every stage so far was reused in place from `previous`
    progress: RunProgress | None = None
    done: list[StageRun] = field(default_factory=list)
    links: list[ChainLink] = field(default_factory=list)

    @classmethod
    def start(cls, params: CurateParams) -> StageRunner:
        flow_run_id = str(get_run_context().flow_run.id)
        register_process(flow_run_id)
        return cls(
            repo_spec=params.repository.spec or default_repo_spec(),
            branch=run_branch(flow_run_id),
            flow_run_id=flow_run_id,
            results_dir=results_dir(params.repository.results),
            retry_options=params.retry.task_options(),
        )

    def begin(self, start: RunStart) -> None:
        """The run branch exists at ``start.head`` (main's head when the run started)."""
        self.head, self.previous = start.head, start.previous
        self.on_published_chain = self.previous is not None
        self.progress = RunProgress(layout.STAGES, self.branch)

    @property
    def results(self) -> dict[str, StageResult]:
        return {run.result.stage: run.result for run in self.done}

    def run(self, stage: str, stage_task: Any, config: Any, input_commit: str) -> StageResult:
        assert self.progress is not None, "begin() first"
        self.progress.started(stage)
        published = self.previous.link(stage) if self.previous and self.on_published_chain else None
        key, decision = plan_stage(
            stage, self.repo_spec, self.branch, config, input_commit, self.results_dir, published
        )
        runnable = stage_task.with_options(
            cache_policy=StageCachePolicy(stage=stage),
            result_storage=self.results_dir,
            persist_result=True,
            refresh_cache=decision == "refresh",
            retry_condition_fn=retry_transient,
            **self.retry_options,
        )
        state = runnable(
            self.repo_spec, self.branch, config, input_commit, self.flow_run_id, return_state=True
        )
        result: StageResult = state.result()
        reused = state.name == "Cached"
        if reused and decision == "fast-forward":
            open_repo(self.repo_spec, create=False).reset_hard(self.branch, result.commit_id)
        self.on_published_chain = self.on_published_chain and reused and decision == "in-place"
        done = StageRun(result, reused, computed_by=run_label(result.flow_run_id) if reused else "")
        if reused:
            leave_stage_table(result, computed_by=done.computed_by)
        self.done.append(done)
        self.links.append(ChainLink(stage, key, result.commit_id))
        self.progress.finished(done)
        return result


def published_version_at(repo: Any, head: str) -> PublishRecord | None:
    """What the version at main's head was built from, if a curate run published it.

    After a rollback, main's head is the rollback's own commit: the version it restored is
    the one whose stages are reused (the key is content, not ancestry), once the head is
    checked to hold exactly that version's content."""
    record = published_record(repo, head)
    if record is None or (record.commit != head and repo.diff(record.commit, head)):
        return None
    return record


def run_label(flow_run_id: str) -> str:
    """A flow run as the Prefect UI names it (``brave-tiger``), else its id's first 8 characters;
    empty when the result names no run."""
    if not flow_run_id:
        return ""
    try:
        with get_client(sync_client=True) as client:
            return client.read_flow_run(flow_run_id).name
    except Exception:  # an id from another Prefect API, or one this API has forgotten
        return flow_run_id[:8]


def plan_stage(
    stage: str,
    repo_spec: str,
    branch: str,
    config: Any,
    input_commit: str,
    results: Path,
    published: ChainLink | None,
) -> tuple[str, str]:
    """(cache key, decision): 'in-place', 'fast-forward', 'refresh' (cached, unusable here) or 'run'."""
    key = stage_cache_key(stage, repo_spec, input_commit, config)
    repo = open_repo(repo_spec, create=False)
    cached = cached_stage_result(results, key)
    if published is not None and published.key == key:
        if cached is None or cached.commit_id != published.commit:
            report = json.loads(repo.get(published.commit, layout.report_path(stage)))
            made_by = repo.get_commit(published.commit).metadata.get("flow_run_id", "")
            seed_stage_result(results, key, StageResult(stage, published.commit, report, made_by))
        return key, "in-place"
    if cached is None:
        return key, "run"
    if commit_exists(repo, cached.commit_id) and repo.is_ancestor(repo.resolve(branch), cached.commit_id):
        return key, "fast-forward"
    return key, "refresh"


REUSED_BEFORE_SAFETY = ("ingest", "validate", "dedup")


def check_reuses_version(params: CurateParams, repo_spec: str, version: str | None = None) -> PublishRecord:
    """The published version a safety-only run builds on (``version``, default main's newest),
    checked so that ingest, validate and dedup are reused in place: main's head holds that
    version, and ``params`` give those stages the keys the version was published with.
    Anything else fails with one sentence (a re-run of those stages is ``tokenlake curate``)."""
    from tasks.stage import ConfigError

    repo = open_repo(repo_spec, create=False)
    record = published_version_at(repo, repo.resolve(layout.MAIN))
    if record is None:
        raise ConfigError("main's head is not a published version: run `tokenlake curate` first")
    if version is not None and repo.resolve(version) != record.commit:
        raise ConfigError(
            f"{version} is not main's newest version ({record.tag}): a safety-only run builds on "
            f"main's head; roll main back to {version} first (`tokenlake rollback`), or name {record.tag}"
        )
    configs = {"ingest": params.ingest, "validate": params.validation, "dedup": params.dedup}
    input_commit = ""
    for stage in REUSED_BEFORE_SAFETY:
        link = record.link(stage)
        key = stage_cache_key(stage, repo_spec, input_commit, configs[stage])
        if link is None or link.key != key:
            raise ConfigError(
                f"this config does not reproduce {record.tag}'s {stage} stage (its settings, its code or, "
                f"for ingest, its source files differ), so it would run again: use `tokenlake curate` for that"
            )
        input_commit = link.commit
    return record
