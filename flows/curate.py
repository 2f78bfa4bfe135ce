"""The curate flow: sources -> ingest -> validate -> dedup -> shard -> mix -> publish (DESIGN.md §1).

Each run writes on its own branch ``curate-<flow run id>`` created from ``main``; each stage
is one task that reads its input at the previous stage's commit id and ends in a commit
whose metadata carries stage, stage-config hash, input commit, flow-run id and counts.
When every gate holds, the run is merged into ``main`` and tagged (:mod:`flows.wap`).
Failure never touches ``main``: the Prefect transaction's rollback deletes the run branch,
and the janitor (:mod:`flows.janitor`) removes the branch of a killed process. Finished
stages are reused exactly (:mod:`flows.stage_runner`).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.transactions import BaseTransaction, get_transaction, transaction

from flows.artifacts import SummaryLinks, stages_table, summary
from flows.params import CurateParams, GateConfig, check_ready
from flows.runners import partitions_on
from flows.stage_runner import StageRunner
from flows.wap import ChainLink, PublishedVersion, open_run_branch, publish
from formats import layout
from tasks.dedup.task import dedup_task
from tasks.ingest.task import ingest_task
from tasks.mix.task import mix_task
from tasks.shard.task import shard_task
from tasks.stage import StageResult, config_hash
from tasks.stage_task import IO_RETRIES
from tasks.validate.task import validate_task
from versioning import NotFound, TransientError, data_home, open_repo, validate_path


class PublishRefused(RuntimeError):
    """A publish gate of the run (``[gates]``) did not hold; the message lists every one.

    (A stage's own Great Expectations suites failing is :class:`tasks.gates.ExpectationsFailed`.)
    """


@flow(name="curate", log_prints=True)
def curate(params: CurateParams = CurateParams()) -> PublishedVersion:
    """Curate the configured sources into a new dataset version on ``main``."""
    run = StageRunner.start(params)
    preflight(params, run.repo_spec)
    head = open_branch(run.repo_spec, run.branch)
    with (
        rolled_back_on_failure(run.repo_spec, run.branch),  # main stays untouched
        partitions_on(params.runner.spec, params.runner.workers, params.runner.memory_limit),
    ):
        run.begin(head)
        ingested = run.run("ingest", ingest_task, params.ingest, input_commit=head)
        validated = run.run("validate", validate_task, params.validation, ingested.commit_id)
        deduped = run.run("dedup", dedup_task, params.dedup, validated.commit_id)
        sharded = run.run("shard", shard_task, params.shards, deduped.commit_id)
        mixed = run.run("mix", mix_task, params.mix, sharded.commit_id)
        check_gates(params.gates, [s.name for s in params.ingest.sources], run.results)
        version = publish_task(run.repo_spec, mixed.commit_id, run.links, run.flow_run_id, config_hash(params.gates))
    close_branch(run.repo_spec, run.branch)
    stages_table(run.done)
    print(summary(version, run.branch, run.done, summary_links(run.repo_spec, version.tag, params.repository.lakefs_ui)))
    return version


@task(name="preflight", cache_policy=NO_CACHE)
def preflight(params: CurateParams, repo_spec: str) -> None:
    """Sources, mix and repository checked before any work (a misconfiguration is one sentence)."""
    check_ready(params, repo_spec)


@task(name="open-run-branch", cache_policy=NO_CACHE, **IO_RETRIES)
def open_branch(repo_spec: str, branch: str) -> str:
    """Create the run branch from main (and the repository if new); returns main's head."""
    return open_run_branch(open_repo(repo_spec), branch)


@task(name="guard-run-branch", cache_policy=NO_CACHE)
def guard_branch(repo_spec: str, branch: str) -> None:
    """No work: it puts the rollback hook below into the run's transaction."""
    txn = get_transaction()
    assert txn is not None, "guard_branch runs inside the run's transaction"
    txn.set("repo_spec", repo_spec)
    txn.set("branch", branch)


@guard_branch.on_rollback
def _delete_run_branch(txn: Any) -> None:
    """Delete the run branch, retried as IO tasks are: what failed the run may be lakeFS being
    down, and the delete then needs it back. If it never comes back, the janitor removes the
    branch of this failed run later."""
    branch = txn.get("branch")
    for delay in [*IO_RETRIES["retry_delay_seconds"], None]:
        try:
            open_repo(txn.get("repo_spec"), create=False).delete_branch(branch)
            return
        except NotFound:
            return
        except TransientError as exc:
            if delay is None:
                logging.getLogger(__name__).warning(
                    "curate: run branch %s is left (%s); `tokenlake janitor` removes it", branch, exc
                )
                return
            time.sleep(delay * (1 + random.uniform(0, IO_RETRIES["retry_jitter_factor"])))


@contextmanager
def rolled_back_on_failure(repo_spec: str, branch: str) -> Iterator[None]:
    """A Prefect transaction whose rollback deletes the run branch when the block fails.

    The tasks inside run outside the transaction: in Prefect, a failed attempt of a task
    inside a transaction rolls the transaction back even when a retry then succeeds, which
    would delete the branch under a run that goes on. Only the block's failure rolls back.
    """
    with transaction():
        guard_branch(repo_spec, branch)
        detached = BaseTransaction.__var__.set(None)  # tasks below open transactions of their own
        try:
            yield
        finally:
            BaseTransaction.__var__.reset(detached)


@task(name="close-run-branch", cache_policy=NO_CACHE, **IO_RETRIES)
def close_branch(repo_spec: str, branch: str) -> None:
    """The run is on main now (merged, or it was already there): its branch goes."""
    try:
        open_repo(repo_spec, create=False).delete_branch(branch)
    except NotFound:
        pass


def gate_failures(gates: GateConfig, sources: list[str], results: dict[str, StageResult]) -> list[str]:
    """Every gate that does not hold, each as one sentence."""
    failures = []
    shard = results["shard"].report
    kept, tokens = shard.get("kept", 0), shard.get("tokens", 0)
    if kept < gates.min_documents:
        failures.append(f"{kept} documents reached the shards, fewer than min_documents={gates.min_documents}")
    if tokens < gates.min_tokens:
        failures.append(f"the shards hold {tokens} tokens, fewer than min_tokens={gates.min_tokens}")
    ingested = results["ingest"].report.get("documents_in", 0)
    if ingested and 1 - kept / ingested > gates.max_quarantined_fraction:
        failures.append(
            f"{1 - kept / ingested:.1%} of ingested documents were quarantined, more than "
            f"max_quarantined_fraction={gates.max_quarantined_fraction}"
        )
    if gates.every_source_in_shards:
        per_source = shard.get("per_source") or {}
        missing = [s for s in sources if not _source_tokens(per_source.get(s))]
        if missing:
            failures.append(f"source(s) {', '.join(missing)} have no tokens in the shards")
    if gates.expectations_must_pass:
        for stage, result in results.items():
            if (result.report.get("expectations") or {}).get("success") is False:
                failures.append(f"the {stage} stage's Great Expectations results failed")
    return failures


def _source_tokens(stats: dict[str, Any] | None) -> int:
    stats = stats or {}
    return int(stats.get("stored_tokens", stats.get("tokens", 0)) or 0)


@task(name="check-gates", cache_policy=NO_CACHE)
def check_gates(gates: GateConfig, sources: list[str], results: dict[str, StageResult]) -> None:
    failures = gate_failures(gates, sources, results)
    if failures:
        raise PublishRefused("not published: " + "; ".join(failures))


@task(name="publish", cache_policy=NO_CACHE, **IO_RETRIES)
def publish_task(
    repo_spec: str, run_head: str, links: list[ChainLink], flow_run_id: str, gates_hash: str
) -> PublishedVersion:
    """Merge the run into main and tag it (idempotent: a retry never publishes twice)."""
    version = publish(open_repo(repo_spec, create=False), run_head, links, flow_run_id, gates_hash)
    get_run_logger().info("curate: %s", version)
    return version


@task(name="summary-links", cache_policy=NO_CACHE, **IO_RETRIES)
def summary_links(repo_spec: str, tag: str, lakefs_ui: str | None) -> SummaryLinks:
    """Where to look: each stage's Data Docs (lakeFS UI pages, or local copies) and the lakeFS UI."""
    repo = open_repo(repo_spec, create=False)
    docs = f"{layout.DATA_DOCS}/"
    stages = sorted({o.path.removeprefix(docs).split("/")[0] for o in repo.list(tag, docs) if o.path.endswith("/index.html")})
    if repo_spec.startswith("lakefs://"):
        ui = lakefs_ui or getattr(repo, "endpoint", "")
        name = repo_spec.removeprefix("lakefs://").strip("/")
        pages = {s: f"{ui}/repositories/{name}/object?ref={tag}&path={layout.data_docs_folder(s)}/index.html" for s in stages}
        return SummaryLinks(data_docs=pages, lakefs_ui=ui, repository=name)
    target = data_home() / "data-docs" / tag  # browsers open local files, not repository objects
    for stat in repo.list(tag, docs):
        # Any lakeFS key may be listed ("a/../b"); only a safe relative path becomes a file.
        path = target / validate_path(stat.path.removeprefix(docs))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(repo.get(tag, stat.path))
    return SummaryLinks(data_docs={s: (target / s / "index.html").as_uri() for s in stages}, repository=repo_spec)
