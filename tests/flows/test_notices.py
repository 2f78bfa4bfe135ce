"""Warnings a user must see (flows/notices.py) reach both the console of an interactive command
and the Prefect run's log, on the real Prefect API: a publish-lock takeover, and a run branch
that a failed run could not delete."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.logging.handlers import APILogWorker
from prefect.runtime import flow_run

from flows.cli import show_notice
from flows.curate import discard_run_branch
from flows.notices import to_console
from flows.params import CurateParams
from flows.wap import MAIN, PUBLISH_LOCK_BRANCH, publish_lock, run_branch
from tests.lakefs_double import LakeFSDouble
from tests.versioning.lakefs_backends import connect
from versioning.local import LocalRepo

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _run_log(flow_run_id: str) -> list[tuple[int, str]]:
    APILogWorker.drain_all()  # sends what is queued and waits for it
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return [(record.level, record.message) for record in logs]


@flow(name="notice-takeover")
def _publish_under_the_lock(root: str) -> str:
    with publish_lock(LocalRepo(root), flow_run.get_id()):
        pass
    return flow_run.get_id()


def test_a_publish_lock_taken_over_from_a_dead_process_is_told_on_the_console_and_in_the_runs_log(
    tmp_path, capsys
):
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    repo.create_branch(PUBLISH_LOCK_BRANCH, MAIN)
    holder = {
        "stage": "lock",
        "flow_run_id": "killed-run",
        "host": socket.gethostname(),
        "pid": str(_dead_pid()),
    }
    repo.commit(PUBLISH_LOCK_BRANCH, "lock", holder, allow_empty=True)

    with to_console(show_notice):
        run_id = _publish_under_the_lock(str(repo.root))

    said = f"publish lock of flow run killed-run (process {holder['pid']} on {holder['host']}) is held by a dead process"
    assert f"tokenlake: warning: {said}; taking it over" in capsys.readouterr().err
    assert any(level == logging.WARNING and said in message for level, message in _run_log(run_id))


@flow(name="notice-branch-left", on_failure=[discard_run_branch])
def _failing_curate(params: CurateParams) -> None:
    raise RuntimeError("a stage failed")


def test_a_run_branch_the_failed_run_could_not_delete_is_told_on_the_console_and_in_the_runs_log(
    tmp_path, monkeypatch
):
    seen: list[tuple[int, str]] = []
    with LakeFSDouble(tmp_path / "lakefs") as double:
        monkeypatch.setenv("LAKECTL_SERVER_ENDPOINT_URL", double.endpoint)
        monkeypatch.setenv("LAKECTL_CREDENTIALS_ACCESS_KEY_ID", double.access_key_id)
        monkeypatch.setenv("LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY", double.secret_access_key)
        monkeypatch.setenv("LAKECTL_CONFIG_FILE", str(tmp_path / "none.yaml"))
        connect(double, "left").ensure()
        monkeypatch.setenv(
            "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY", "rotated-meanwhile"
        )  # the delete is refused
        params = CurateParams.model_validate({"repository": {"spec": "lakefs://left"}})
        with to_console(lambda level, message: seen.append((level, message))):
            state = _failing_curate(params, return_state=True)

    assert state.is_failed()
    branch = run_branch(str(state.state_details.flow_run_id))
    ((level, message),) = seen
    assert level == logging.WARNING and f"run branch {branch} is left" in message
    assert "rejected the credentials" in message and "`tokenlake janitor` removes it" in message
    assert (logging.WARNING, message) in _run_log(str(state.state_details.flow_run_id))
