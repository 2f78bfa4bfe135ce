"""A curate process killed with SIGKILL in the middle of a stage (shard, half written): the re-run completes without duplicates, and the
janitor removes the orphaned run branch (never while its run is alive). Killed inside the publish, holding the publish lock: the
re-run takes the dead process's lock over and publishes, without waiting for the janitor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL

from flows import publish_guard
from flows.curate import curate
from flows.janitor import sweep
from flows.wap import (
    MAIN,
    PUBLISH_LOCK_BRANCH,
    RUN_BRANCH_PREFIX,
    PublishRecord,
    flow_run_of_branch,
    publish_in_progress,
)
from tests.flows.curate_support import column, params_for, ran_from, stage_outcomes, write_corpus
from versioning.local import LocalRepo

pytestmark = pytest.mark.usefixtures("prefect_harness")

RUN_FLOW = """
import sys
from flows.curate import curate
from flows.params import CurateParams
curate(CurateParams.model_validate_json(open(sys.argv[1]).read()))
"""

# The flow, parked inside the publish: holding the publish lock, at the merge into main. It says
# so with a file, and waits there to be killed (the kill then lands where a campaign trial's did).
RUN_FLOW_PARKED_AT_MERGE = (
    """
import sys
import threading
from pathlib import Path
from versioning.local import LocalRepo

def park(self, *args, **kwargs):
    Path(sys.argv[2]).touch()
    threading.Event().wait()

LocalRepo.merge = park
"""
    + RUN_FLOW
)


def _wait_for_shard_stage_writing(repo: LocalRepo, process: subprocess.Popen) -> str:
    """The run branch once the shard stage has written its tokenizer, uncommitted (polling)."""
    while process.poll() is None:
        for branch, head in repo.list_branches().items():
            if (
                branch.startswith(RUN_BRANCH_PREFIX)
                and repo.get_commit(head).metadata.get("stage") == "safety"  # the stage before shard
                and repo.exists(branch, "tokenizer/tokenizer.json")
            ):
                return branch
        time.sleep(0.02)
    raise AssertionError(f"the flow process exited ({process.returncode}) before the shard stage wrote")


def test_sigkill_mid_run_then_rerun_completes_and_janitor_removes_the_orphan(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENLAKE_HOME", str(tmp_path / "home"))
    corpus = write_corpus(tmp_path / "sources", documents=60)
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    publish_guard.install(repo)  # as `tokenlake repo install-hooks`, or the first curate run, leaves main
    main_before = repo.resolve(MAIN)
    params = params_for(corpus, str(repo.root), tmp_path / "results")
    params_file = tmp_path / "params.json"
    params_file.write_text(params.model_dump_json())

    env = os.environ | {"PREFECT_API_URL": PREFECT_API_URL.value(), "TOKENLAKE_HOME": str(tmp_path / "home")}
    process = subprocess.Popen([sys.executable, "-c", RUN_FLOW, str(params_file)], env=env)
    try:
        orphan = _wait_for_shard_stage_writing(repo, process)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    assert repo.resolve(MAIN) == main_before, "killed before publishing: main untouched"
    killed_run = flow_run_of_branch(orphan)
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(killed_run).state.name == "Running", "nobody told Prefect it died"

    with stage_outcomes() as outcomes:
        version = curate(params)
    assert outcomes == ran_from("shard")  # safety had committed before the kill
    assert repo.resolve(MAIN) == version.commit_id
    for prefix in ("raw/", "filtered/", "dedup/"):
        ids = column(repo, version.tag, prefix, "id")
        assert len(ids) == len(set(ids)) > 0, f"no duplicated documents under {prefix}"
    ingested = len(column(repo, version.tag, "raw/", "id")) + len(
        column(repo, version.tag, "quarantine/ingest/", "id")
    )
    assert ingested == sum(1 for path in corpus.values() for f in path.iterdir()), "every source file, once"

    verdicts = {v.branch: v for v in sweep(repo, max_age_hours=24)}
    assert not verdicts[orphan].removed and verdicts[orphan].state == "Crashed"
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(killed_run).state.name == "Crashed"
    verdicts = {v.branch: v for v in sweep(repo, max_age_hours=0)}
    assert verdicts[orphan].removed and set(repo.list_branches()) == {MAIN}


def test_sigkill_holding_the_publish_lock_then_rerun_takes_the_dead_lock_over_and_publishes(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TOKENLAKE_HOME", str(tmp_path / "home"))
    corpus = write_corpus(tmp_path / "sources", documents=60)
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    params = params_for(corpus, str(repo.root), tmp_path / "results")
    params_file = tmp_path / "params.json"
    params_file.write_text(params.model_dump_json())
    parked = tmp_path / "parked-at-merge"

    env = os.environ | {"PREFECT_API_URL": PREFECT_API_URL.value(), "TOKENLAKE_HOME": str(tmp_path / "home")}
    process = subprocess.Popen(
        [sys.executable, "-c", RUN_FLOW_PARKED_AT_MERGE, str(params_file), str(parked)], env=env
    )
    try:
        while not parked.exists():
            assert process.poll() is None, (
                f"the flow process exited ({process.returncode}) before its publish merged"
            )
            time.sleep(0.02)
        os.kill(process.pid, signal.SIGKILL)  # the main process only, as the OOM killer does
    finally:
        process.kill()
        process.wait()
    holder = publish_in_progress(repo)
    assert holder is not None and holder["pid"] == str(process.pid), "killed holding the publish lock"
    assert PublishRecord.from_commit(repo.get_commit(MAIN)) is None, "killed before the merge"

    version = curate(params)  # no janitor in between: the re-run itself frees the dead process's lock

    assert version.new and repo.resolve(MAIN) == version.commit_id
    assert sum(PublishRecord.from_commit(c) is not None for c in repo.log(MAIN)) == 1, "one publish on main"
    assert PUBLISH_LOCK_BRANCH not in repo.list_branches(), "the re-run released the lock it took over"
