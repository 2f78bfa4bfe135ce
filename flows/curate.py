"""The curate flow: sources -> ingest -> validate -> dedup -> safety -> shard -> mix -> publish (DESIGN.md §1).

Each run writes on its own branch ``curate-<flow run id>`` created from ``main``; each stage
is one task that reads its input at the previous stage's commit id and ends in a commit
whose metadata carries stage, stage-config hash, input commit, flow-run id and counts.
When every gate holds, the run is merged into ``main`` and tagged (:mod:`flows.wap`).

Failure never touches ``main``. A run that fails says why in its log, at ERROR, in the
paragraph ``tokenlake curate`` prints (:mod:`flows.failed_run`: the gate, its failing
expectations or rule, what became of ``main`` and the run branch, what to change), and in a
``curate-summary`` artifact of state Failed; a refusal's traceback is not logged
(:mod:`flows.refusals`). It deletes its run branch before saying so; the flow's ``on_failure``
and ``on_crashed`` hooks (Prefect's state-change hooks) delete it when the run as a whole fails
otherwise (a crash, a repository that stopped answering); a task attempt that fails and is
retried is not a flow failure, so it never does. The janitor (:mod:`flows.janitor`) removes
the branch of a process that was killed outright. Finished stages are reused exactly
(:mod:`flows.stage_runner`).

The run shows eight task runs: ``open-run-branch``, the six stages, ``publish``; the
bookkeeping between them is the flow's own code.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_image_artifact
from prefect.cache_policies import NO_CACHE
from prefect.logging.loggers import flow_run_logger
from pydantic import ValidationError

from flows.artifacts import StageRun, SummaryLinks, stages_table, summary
from flows.failed_run import failed_summary, failure_report, repository_state, unchecked_state
from flows.funnel import draw_funnel, funnel_of, funnel_path, image_url
from flows.notices import notice
from flows.params import CurateParams, GateConfig, check_ready
from flows.refusals import PublishRefused
from flows.runners import partitions_on
from flows.stage_runner import RunStart, StageRunner, published_version_at
from flows.wap import ChainLink, PublishedVersion, open_run_branch, publish, run_branch
from formats import layout
from tasks.dedup.task import dedup_task
from tasks.gates import ExpectationsFailed
from tasks.ingest.task import ingest_task
from tasks.mix.task import mix_task
from tasks.safety.task import safety_task
from tasks.shard.task import shard_task
from tasks.stage import StageResult, config_hash
from tasks.stage_task import IO_RETRIES
from tasks.validate.task import validate_task
from versioning import (
    NotFound,
    RepoError,
    TransientError,
    data_home,
    default_repo_spec,
    open_repo,
    validate_path,
)


def discard_run_branch(flow: Any, flow_run: Any, state: Any) -> None:
    """``on_failure`` / ``on_crashed``: the run did not publish, so its branch goes (main never moved)."""
    try:
        params = CurateParams.model_validate((flow_run.parameters or {}).get("params") or {})
    except ValidationError:
        return  # the run failed on its parameters, before it opened a branch
    delete_run_branch(
        params.repository.spec or default_repo_spec(),
        run_branch(str(flow_run.id)),
        flow_run_logger(flow_run, flow),
    )


def delete_run_branch(repo_spec: str, branch: str, logger: Any = None) -> None:
    """Delete a failed run's branch, retried as IO tasks are: what failed the run may be lakeFS
    being down, and the delete then needs it back. If it never comes back, the janitor removes
    the branch later, and the user is told (``logger``: the run's, from a state hook)."""
    delays = IO_RETRIES["retry_delay_seconds"](IO_RETRIES["retries"])
    for delay in [*delays, None]:
        try:
            open_repo(repo_spec, create=False).delete_branch(branch)
            return
        except NotFound:
            return  # never opened, or already gone
        except TransientError as exc:
            if delay is None:
                _warn_branch_left(branch, exc, logger)
                return
            time.sleep(delay * (1 + random.uniform(0, IO_RETRIES["retry_jitter_factor"])))
        except RepoError as exc:
            _warn_branch_left(branch, exc, logger)
            return


def _warn_branch_left(branch: str, exc: Exception, logger: Any) -> None:
    notice(f"curate: run branch {branch} is left ({exc}); `tokenlake janitor` removes it", logger=logger)


@flow(name="curate", log_prints=True, on_failure=[discard_run_branch], on_crashed=[discard_run_branch])
def curate(params: CurateParams = CurateParams()) -> PublishedVersion:
    """Curate the configured sources into a new dataset version on ``main``."""
    run = StageRunner.start(params)
    try:
        run.begin(open_run(params, run.repo_spec, run.branch))  # main stays untouched until publish
        runner = params.runner
        with partitions_on(runner.spec, runner.workers, runner.memory_limit, runner.dashboard):
            ingested = run.run("ingest", ingest_task, params.ingest, input_commit=run.head)
            validated = run.run("validate", validate_task, params.validation, ingested.commit_id)
            deduped = run.run("dedup", dedup_task, params.dedup, validated.commit_id)
            safe = run.run("safety", safety_task, params.safety, deduped.commit_id)
            sharded = run.run("shard", shard_task, params.shards, safe.commit_id)
            mixed = run.run("mix", mix_task, params.mix, sharded.commit_id)
        version = publish_task(
            run.repo_spec, run.branch, mixed.commit_id, run.links, run.flow_run_id, params, run.results
        )
    except Exception as exc:
        try:
            explain_failure(exc, params, run)
        except Exception:  # saying why must never replace the reason the run fails with
            get_run_logger().exception("curate: the failure below could not be explained")
        raise  # the run is Failed; Prefect logs a refusal without its traceback (flows.refusals)
    print(report_run(params, run.repo_spec, run.branch, run.done, version))
    return version


def explain_failure(exc: Exception, params: CurateParams, run: StageRunner) -> None:
    """Say why the run failed (:mod:`flows.failed_run`): one ERROR record in the run's log and
    the run's ``curate-summary`` artifact (state Failed, the reason, the Data Docs to read).

    The run branch goes first, so that the paragraph says what became of it (the ``on_failure``
    hook then finds it gone). When the repository is what failed, nothing more is asked of it
    here: the hook deletes the branch, retrying, and says so if it cannot."""
    began = run.progress is not None  # the run branch was opened
    branch = run.branch if began else None
    docs: dict[str, str] = {}
    if isinstance(exc, TransientError):
        repository = unchecked_state(exc)
    else:
        docs = failure_docs(exc, params, run)
        if branch:
            delete_run_branch(run.repo_spec, branch)
        repository = (
            repository_state(run.repo_spec, run.head, branch)
            if began
            else "main is unchanged: the run stopped before it opened its run branch."
        )
    report = failure_report(exc, repository, in_run=True)
    get_run_logger().error(report)
    finished = [f"{done.result.stage} ({'reused' if done.reused else 'ran'})" for done in run.done]
    failed_summary(report, branch, docs, finished)


def failure_docs(exc: Exception, params: CurateParams, run: StageRunner) -> dict[str, str]:
    """The Data Docs a failed run points to: the failing gate's (kept on this machine when its
    run branch goes, :func:`tasks.gates.gate_stage`), else each finished stage's, at the run's
    last stage commit (copied to the data home, as for a published version)."""
    if isinstance(exc, ExpectationsFailed):
        return {exc.stage: Path(exc.data_docs).as_uri()} if exc.data_docs else {}
    if not run.done:
        return {}
    try:
        return summary_links(
            run.repo_spec, run.done[-1].result.commit_id, params.repository.lakefs_ui
        ).data_docs
    except RepoError:
        return {}


@task(name="open-run-branch", cache_policy=NO_CACHE, **IO_RETRIES)
def open_run(params: CurateParams, repo_spec: str, branch: str) -> RunStart:
    """Check sources, mix and repository (a misconfiguration is one sentence), create the run
    branch from main (and the repository if new), and read what main's head was published from."""
    check_ready(params, repo_spec)
    repo = open_repo(repo_spec)
    head = open_run_branch(repo, branch)
    return RunStart(head, published_version_at(repo, head))


def gate_failures(gates: GateConfig, sources: list[str], results: dict[str, StageResult]) -> list[str]:
    """Every gate that does not hold, each as one sentence."""
    failures = []
    shard = results["shard"].report
    kept, tokens = shard.get("kept", 0), shard.get("tokens", 0)
    if kept < gates.min_documents:
        failures.append(
            f"{kept} documents reached the shards, fewer than min_documents={gates.min_documents}"
        )
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


def check_gates(gates: GateConfig, sources: list[str], results: dict[str, StageResult]) -> None:
    failures = gate_failures(gates, sources, results)
    if failures:
        raise PublishRefused(failures)


@task(name="publish", cache_policy=NO_CACHE, **IO_RETRIES)
def publish_task(
    repo_spec: str,
    branch: str,
    run_head: str,
    links: list[ChainLink],
    flow_run_id: str,
    params: CurateParams,
    results: dict[str, StageResult],
) -> PublishedVersion:
    """Check the publish gates, merge the run into main and tag it, and delete the run branch
    (idempotent: a retry never publishes twice)."""
    check_gates(params.gates, [s.name for s in params.ingest.sources], results)
    repo = open_repo(repo_spec, create=False)
    version = publish(repo, run_head, links, flow_run_id, config_hash(params.gates))
    get_run_logger().info("curate: %s", version)
    try:
        repo.delete_branch(branch)  # the run is on main now (merged, or it was already there)
    except NotFound:
        pass
    return version


def report_run(
    params: CurateParams, repo_spec: str, branch: str, done: list[StageRun], version: PublishedVersion
) -> str:
    """The run's table, funnel and summary artifacts; returns the summary's text."""
    stages_table(done)
    results = {run.result.stage: run.result for run in done}
    funnel = draw_funnel(funnel_of(results), funnel_path(version.tag), f"curate {version.tag}")
    create_image_artifact(
        image_url(funnel),
        key="curate-funnel",
        description=f"documents and tokens per source through the stages, {version.tag}",
    )
    links = summary_links(repo_spec, version.tag, params.repository.lakefs_ui)
    links = SummaryLinks(links.data_docs, links.lakefs_ui, links.repository, str(funnel))
    return summary(version, branch, done, links)


def summary_links(repo_spec: str, tag: str, lakefs_ui: str | None) -> SummaryLinks:
    """Where to look: each stage's Data Docs (lakeFS UI pages, or local copies) and the lakeFS UI."""
    repo = open_repo(repo_spec, create=False)
    docs = f"{layout.DATA_DOCS}/"
    stages = sorted(
        {
            o.path.removeprefix(docs).split("/")[0]
            for o in repo.list(tag, docs)
            if o.path.endswith("/index.html")
        }
    )
    if repo_spec.startswith("lakefs://"):
        ui = lakefs_ui or getattr(repo, "endpoint", "")
        name = repo_spec.removeprefix("lakefs://").strip("/")
        pages = {
            s: f"{ui}/repositories/{name}/object?ref={tag}&path={layout.data_docs_folder(s)}/index.html"
            for s in stages
        }
        return SummaryLinks(data_docs=pages, lakefs_ui=ui, repository=name)
    target = data_home() / "data-docs" / tag  # browsers open local files, not repository objects
    for stat in repo.list(tag, docs):
        # Any lakeFS key may be listed ("a/../b"); only a safe relative path becomes a file.
        path = target / validate_path(stat.path.removeprefix(docs))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(repo.get(tag, stat.path))
    return SummaryLinks(
        data_docs={s: (target / s / "index.html").as_uri() for s in stages}, repository=repo_spec
    )
