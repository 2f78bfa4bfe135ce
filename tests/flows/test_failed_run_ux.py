"""A failed run explains itself (issue 31), on the real Prefect API: what its log and artifacts say.

A curate run refused at a gate logs one ERROR paragraph (the gate, its failing expectations or
rule, what became of main and the run branch, what to change) and leaves a ``curate-summary``
artifact of state Failed; the train and rollback flows' refusals are one-line ERRORs; none of
them logs a traceback and none is retried. A bug (an unexpected exception) keeps its traceback.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.logging.handlers import APILogWorker

from flows.curate import PublishRefused, curate
from flows.refusals import ENGINE_LOGGERS, retry_unless_refused
from flows.restore import plan_rollback, restore_main
from flows.rollback import RollbackParams, rollback
from flows.train import TrainParams, train_flow
from tests.flows.curate_support import params_for, write_corpus
from tests.flows.lineage_support import (
    BACKENDS,
    BAD_SOURCES,
    GOOD_SOURCES,
    TINY_RUN,
    publish_version,
    train_tiny,
)
from versioning.local import LocalRepo

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture(autouse=True)
def runs_log_at_info():
    """The run loggers at INFO, as outside the tests (tests/conftest.py quiets Prefect to WARNING):
    the lines that say a task is retried, or which torchrun attempt started, are INFO."""
    loggers = [logging.getLogger(name) for name in ENGINE_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.INFO)
    yield
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)


def _run_log(flow_run_id: str) -> list[tuple[int, str]]:
    """(level, message) of every record of the flow run and its task runs, oldest first."""
    APILogWorker.drain_all()  # sends what is queued and waits for it
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return [(record.level, record.message) for record in logs]


def _artifacts(flow_run_id: str) -> dict[str, str]:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {a.key: a.data for a in found if a.key}


def _failed(state) -> tuple[str, list[tuple[int, str]]]:
    assert state.is_failed(), state
    run_id = str(state.state_details.flow_run_id)
    log = _run_log(run_id)
    assert any(level == logging.INFO for level, _ in log), "the run's INFO lines are read back"
    assert not [m for _, m in log if "Traceback" in m], "a refusal logs no traceback"
    assert not [m for _, m in log if "Retry 1/" in m], "a refusal is not retried"
    return run_id, log


def _errors(log: list[tuple[int, str]]) -> list[str]:
    return [message for level, message in log if level >= logging.ERROR]


def test_a_curate_run_refused_at_publish_says_why_in_one_paragraph_and_a_failed_summary(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TOKENLAKE_HOME", str(tmp_path / "home"))
    corpus = write_corpus(tmp_path / "sources", documents=12)
    params = params_for(corpus, str(tmp_path / "repo"), tmp_path / "results", gates={"min_tokens": 10**9})

    run_id, log = _failed(curate(params, return_state=True))

    (paragraph,) = [m for m in _errors(log) if "\n" in m]  # the engine's own ERROR lines are one line each
    gate, rule, state, change = paragraph.splitlines()
    assert gate == "the publish gates ([gates] of the config) refused the run:"
    assert rule.startswith("  - the shards hold ") and rule.endswith(
        "tokens, fewer than min_tokens=1000000000"
    )
    assert state.startswith("main is unchanged") and state.endswith("was removed.")
    assert f"the run branch curate-{run_id} " in state
    assert change.startswith("To publish: ") and "[gates] settings" in change
    assert set(LocalRepo(tmp_path / "repo").list_branches()) == {"main"}, "the branch was removed, as it says"

    summary = _artifacts(run_id)["curate-summary"]
    assert "State: **Failed**." in summary and "fewer than min_tokens=1000000000" in summary
    assert change in summary
    docs = [line.split("`")[1] for line in summary.splitlines() if line.startswith("- [")]
    assert docs and all(Path(url.removeprefix("file://")).is_file() for url in docs), docs


def test_a_failing_expectation_gate_names_its_expectation_data_docs_and_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENLAKE_HOME", str(tmp_path / "home"))
    corpus = write_corpus(tmp_path / "sources", documents=12)
    params = params_for(
        corpus, str(tmp_path / "repo"), tmp_path / "results", validation={"gate": {"max_text_chars": 10}}
    )  # every document is longer

    run_id, log = _failed(curate(params, return_state=True))

    (paragraph,) = [m for m in _errors(log) if "\n" in m]
    lines = paragraph.splitlines()
    assert lines[0].startswith("the validate stage's gate failed ")
    assert any("expect_column_values_to_be_between(text_chars)" in line for line in lines[1:-3])
    docs = lines[-3].removeprefix("Data Docs: ")
    assert docs.startswith("file://") and Path(docs.removeprefix("file://")).is_file()
    assert lines[-2].startswith("main is unchanged") and lines[-2].endswith("was removed.")
    assert lines[-1].startswith("To publish: ") and "[validation] settings" in lines[-1]

    summary = _artifacts(run_id)["curate-summary"]
    assert "State: **Failed**." in summary and f"[validate]({docs})" in summary


def test_train_and_rollback_refusals_are_one_line_errors_without_traceback(tmp_path):
    with BACKENDS["local"](tmp_path) as (repo, spec):
        v1 = publish_version(repo, "curate-1", GOOD_SOURCES, seed=1)
        v2 = publish_version(repo, "curate-2", BAD_SOURCES, seed=2)
        restore_main(repo, plan_rollback(repo, v1.tag), "flow-1")
        refusals = [
            (train_flow, TrainParams(dataset=v2.tag, repo=spec), f"data commit {v2.tag} ({v2.commit_id[:12]}) was reverted by "),
            (train_flow, TrainParams(dataset="ds-nope", repo=spec), "dataset ds-nope: no such tag, branch or commit"),
            (rollback, RollbackParams(to="ds-nope", repository=spec), "'ds-nope' is not a tag, branch or commit"),
        ]  # fmt: skip
        for run, params, says in refusals:
            _, log = _failed(run(params, return_state=True))
            errors = _errors(log)
            assert errors and all(says in m and "\n" not in m for m in errors), errors


def test_a_refused_resume_is_not_retried_and_logs_the_trainers_sentence_without_traceback(tmp_path):
    with BACKENDS["local"](tmp_path) as (repo, spec):
        v1 = publish_version(repo, "curate-1", GOOD_SOURCES, seed=1)
        home = tmp_path / "home"
        train_tiny(spec, home, "taken", v1.commit_id, steps=2)  # the run has checkpoints now
        params = TrainParams(
            dataset=v1.tag, run="taken", steps=2, nproc=1, repo=spec, resume="never", retries=2,
            overrides={"home": str(home), **TINY_RUN},
        )  # fmt: skip

        _, log = _failed(train_flow(params, return_state=True))

    messages = [m for _, m in log]
    assert [m.split(":")[0] for m in messages if m.startswith("attempt ")] == ["attempt 1"], "not retried"
    says = "the trainer refused the run: run 'taken' already has checkpoints in "
    errors = _errors(log)
    assert errors and all(says in m and "\n" not in m for m in errors), errors
    assert not [m for m in messages if "ChildFailedError" in m], "torchrun's report of a crash is not there"


@task(retries=1, retry_delay_seconds=0, retry_condition_fn=retry_unless_refused)
def _step(refuse: bool) -> None:
    if refuse:
        raise PublishRefused(["the shards hold 0 tokens, fewer than min_tokens=1"])
    {}["a key nobody set"]  # noqa: B018 (a bug: KeyError)


@flow(name="failed-run-ux-step")
def _one_step(refuse: bool) -> None:
    _step(refuse)


def test_a_bug_keeps_its_traceback_and_is_retried_where_a_refusal_is_not():
    _, refused = _failed(_one_step(True, return_state=True))
    assert any("not published: the shards hold 0 tokens" in m for m in _errors(refused))

    state = _one_step(False, return_state=True)
    assert state.is_failed()
    log = _run_log(str(state.state_details.flow_run_id))
    assert any("Retry 1/1" in m for _, m in log), "a bug is retried"
    tracebacks = [
        m for level, m in log if level >= logging.ERROR and "Traceback (most recent call last)" in m
    ]
    assert tracebacks and all("KeyError: 'a key nobody set'" in m for m in tracebacks), log
