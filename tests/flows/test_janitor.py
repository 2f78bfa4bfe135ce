"""The janitor against the real Prefect API and a real LocalRepo: which run branches go, which stay."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.states import Completed, Failed, Running

from flows.janitor import JanitorParams, janitor, parse_age, process_alive, sweep
from flows.wap import MAIN, PUBLISH_LOCK_BRANCH, run_branch
from versioning.local import LocalRepo

pytestmark = pytest.mark.usefixtures("prefect_harness")


@flow(name="janitor-test-run")
def _some_run() -> None:
    """Only its flow runs are used: created in a chosen state through the API."""


@pytest.fixture
def repo(tmp_path):
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    return repo


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _flow_run(state, infrastructure_pid: str | None = None) -> str:
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(_some_run, state=state)
        if infrastructure_pid:
            client.update_flow_run(run.id, infrastructure_pid=infrastructure_pid)
        return str(run.id)


def _branch_for(repo: LocalRepo, flow_run_id: str) -> str:
    branch = run_branch(flow_run_id)
    repo.create_branch(branch, MAIN)
    return branch


def _state_name(flow_run_id: str) -> str:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id).state.name


def test_a_finished_runs_branch_goes_once_older_than_max_age(repo):
    failed = _branch_for(repo, _flow_run(Failed()))
    completed = _branch_for(repo, _flow_run(Completed()))
    kept = {v.branch: v for v in sweep(repo, max_age_hours=1)}
    assert not kept[failed].removed and "younger than 1 h" in kept[failed].reason
    assert set(repo.list_branches()) >= {failed, completed}
    removed = {v.branch for v in sweep(repo, max_age_hours=0) if v.removed}
    assert removed == {failed, completed} and set(repo.list_branches()) == {MAIN}


def test_a_live_run_keeps_its_branch_whatever_its_age(repo):
    live = _branch_for(repo, _flow_run(Running(), f"{socket.gethostname()}:{os.getpid()}"))
    elsewhere = _branch_for(repo, _flow_run(Running(), "another-host:1234"))
    verdicts = {v.branch: v for v in sweep(repo, max_age_hours=0)}
    assert not verdicts[live].removed and "alive" in verdicts[live].reason
    assert not verdicts[elsewhere].removed and "another-host" in verdicts[elsewhere].reason
    assert {live, elsewhere} <= set(repo.list_branches())


def test_a_killed_run_is_marked_crashed_and_its_branch_removed(repo):
    flow_run_id = _flow_run(Running(), f"{socket.gethostname()}:{_dead_pid()}")
    branch = _branch_for(repo, flow_run_id)
    (verdict,) = sweep(repo, max_age_hours=0)
    assert verdict.removed and verdict.state == "Crashed"
    assert _state_name(flow_run_id) == "Crashed"
    assert branch not in repo.list_branches()


def test_a_branch_whose_run_this_api_does_not_know_is_kept(repo):
    branch = run_branch("00000000-0000-4000-8000-000000000000")
    repo.create_branch(branch, MAIN)
    (verdict,) = sweep(repo, max_age_hours=0)
    assert not verdict.removed and "not found" in verdict.reason and branch in repo.list_branches()


def test_a_dry_run_removes_nothing(repo):
    branch = _branch_for(repo, _flow_run(Failed()))
    (verdict,) = sweep(repo, max_age_hours=0, dry_run=True)
    assert not verdict.removed and branch in repo.list_branches()


def test_a_publish_lock_of_a_dead_process_is_removed_a_live_one_kept(repo):
    flow_run_id = _flow_run(Running())
    repo.create_branch(PUBLISH_LOCK_BRANCH, MAIN)
    holder = {
        "stage": "lock",
        "flow_run_id": flow_run_id,
        "host": socket.gethostname(),
        "pid": str(os.getpid()),
    }
    repo.commit(PUBLISH_LOCK_BRANCH, "lock", holder, allow_empty=True)
    (verdict,) = sweep(repo, max_age_hours=0)
    assert not verdict.removed and PUBLISH_LOCK_BRANCH in repo.list_branches()

    repo.delete_branch(PUBLISH_LOCK_BRANCH)
    repo.create_branch(PUBLISH_LOCK_BRANCH, MAIN)
    repo.commit(PUBLISH_LOCK_BRANCH, "lock", holder | {"pid": str(_dead_pid())}, allow_empty=True)
    (verdict,) = sweep(repo, max_age_hours=0)
    assert verdict.removed and PUBLISH_LOCK_BRANCH not in repo.list_branches()


def test_the_janitor_flow_reports_what_it_removed(repo):
    branch = _branch_for(repo, _flow_run(Failed()))
    rows = janitor(JanitorParams(repository=str(repo.root), max_age_hours=0))
    assert [(r["branch"], r["removed"]) for r in rows] == [(branch, True)]


def test_process_liveness_and_ages():
    assert process_alive(f"{socket.gethostname()}:{os.getpid()}", None) is True
    assert process_alive(f"{socket.gethostname()}:{_dead_pid()}", None) is False
    assert process_alive("elsewhere:1", None) is None and process_alive(None, None) is None
    assert (
        parse_age("36h") == 36 and parse_age("90m") == 1.5 and parse_age("2d") == 48 and parse_age("0") == 0
    )
    with pytest.raises(ValueError, match="not a duration"):
        parse_age("soon")
