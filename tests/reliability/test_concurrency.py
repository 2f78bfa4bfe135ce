"""Concurrent runs on one repository or one run name: never a lost update, a half-merged main,
or two trainers writing one run; the loser refuses with a sentence that names the winner.

(A rollback while a curate run publishes is refused naming the publishing flow run:
``tests/flows/test_rollback.py::test_refusals_name_what_to_do``; here, the other order.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL

from flows.restore import plan_rollback, restore_main
from flows.wap import (
    MAIN,
    PUBLISH_LOCK_BRANCH,
    MainMoved,
    PublishRecord,
    publish,
)
from tests.flows.curate_support import column, params_for, write_corpus
from tests.flows.lineage_support import GOOD_SOURCES, publish_version
from tests.flows.test_curate_publish import _run as gated_run_branch
from tests.training.helpers import (
    ROOT,
    make_config,
    make_dataset,
    newest_durable_step,
    torchrun,
    torchrun_command,
)
from training.runlock import LOCK_FILE, RunBusy, RunLock
from training.trainer import train
from versioning.local import LocalRepo


def test_a_run_whose_main_moved_is_not_merged_and_names_the_publish_that_moved_it(tmp_path):
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    a, a_chain = gated_run_branch(repo, "curate-a", {"shards/manifest.json": b"a", "mix.json": b"1"})
    b, b_chain = gated_run_branch(repo, "curate-b", {"shards/manifest.json": b"b", "extra.txt": b"only b"})
    first = publish(repo, a, a_chain, "flow-run-a", "gates")
    with pytest.raises(MainMoved) as moved:
        publish(repo, b, b_chain, "flow-run-b", "gates")
    assert str(moved.value) == (
        f"main moved while this run was curating: flow run flow-run-a published {first.tag} "
        f"(commit {first.commit_id[:12]}); nothing was merged, run curate again to build on it"
    )
    assert repo.resolve(MAIN) == first.commit_id and not repo.diff(MAIN, a)  # a's version, whole
    assert [t for t in repo.list_tags() if t.startswith("ds-")] == [first.tag]
    assert PUBLISH_LOCK_BRANCH not in repo.list_branches()


def test_a_publish_after_a_rollback_is_refused_naming_the_rollback(tmp_path):
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    v1 = publish_version(repo, "run-1", GOOD_SOURCES, seed=1)
    publish_version(repo, "run-2", GOOD_SOURCES, seed=2)
    started, chain = gated_run_branch(
        repo, "curate-late", {"shards/manifest.json": b"built on run-2's version"}
    )
    restored = restore_main(repo, plan_rollback(repo, v1.tag), "flow-run-rollback")
    with pytest.raises(MainMoved, match=rf"flow run flow-run-rollback rolled it back \({restored.tag}"):
        publish(repo, started, chain, "flow-run-late", "gates")
    assert repo.resolve(MAIN) == restored.head and not repo.diff(v1.tag, MAIN)


RUN_FLOW = """
import json, sys
from flows.curate import curate
from flows.params import CurateParams
state = curate(CurateParams.model_validate_json(open(sys.argv[1]).read()), return_state=True)
if state.is_completed():
    version = state.result()
    print(json.dumps({"ok": True, "tag": version.tag, "commit": version.commit_id, "new": version.new}))
else:
    print(json.dumps({"ok": False, "error": state.message}))
"""


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_two_curate_runs_started_together_publish_in_turn_or_one_refuses_naming_the_other(tmp_path):
    corpus = write_corpus(tmp_path / "sources", documents=40)
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    initial = repo.resolve(MAIN)
    params_file = tmp_path / "params.json"
    params_file.write_text(params_for(corpus, str(repo.root), tmp_path / "results").model_dump_json())
    env = os.environ | {"PREFECT_API_URL": PREFECT_API_URL.value(), "TOKENLAKE_HOME": str(tmp_path / "home")}
    runs = [
        subprocess.Popen([sys.executable, "-c", RUN_FLOW, str(params_file)], env=env, cwd=ROOT,
                         stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    outcomes = [json.loads(run.communicate(timeout=900)[0].strip().splitlines()[-1]) for run in runs]

    published = [o for o in outcomes if o["ok"]]
    assert published, f"neither run published: {outcomes}"
    records = [PublishRecord.from_commit(c) for c in repo.log(MAIN)]
    publishes = [r for r in records if r is not None]
    assert len(publishes) == sum(o["new"] for o in published) >= 1
    for record in publishes:  # each publish merged one run's checked branch whole, nothing of the other
        assert not repo.diff(record.commit, record.run_head), "main holds exactly what one run checked"
        assert repo.list_tags()[record.tag] == record.commit
    for o in outcomes:
        if not o["ok"]:  # the refusal names the run that published first
            winner = publishes[0]
            assert (
                f"main moved while this run was curating: flow run {winner.flow_run_id} published {winner.tag}"
                in o["error"]
            )
    assert repo.is_ancestor(initial, MAIN) and repo.resolve(MAIN) == publishes[0].commit
    assert set(repo.list_branches()) == {MAIN}, "no run branch or lock left"
    ids = column(repo, MAIN, "dedup/", "id")
    assert len(ids) == len(set(ids)) > 0


def test_a_run_lock_refuses_a_second_holder_and_is_free_once_released(tmp_path):
    first = RunLock(tmp_path / "run", "r", flow_run_id="flow-1").acquire()
    with pytest.raises(
        RunBusy,
        match=rf"run 'r' is being trained by another process \(pid {os.getpid()} on .* flow run flow-1\)",
    ):
        RunLock(tmp_path / "run", "r").acquire()
    first.release()
    RunLock(tmp_path / "run", "r").acquire().release()


def wait_for_lock_holder(lock: os.PathLike, pid: int, process: subprocess.Popen) -> None:
    while process.poll() is None:
        try:
            if json.loads(Path(lock).read_text() or "{}").get("pid") == pid:
                return
        except (OSError, json.JSONDecodeError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"the first trainer exited ({process.returncode}) before it held the run")


@pytest.mark.slow
def test_a_second_trainer_on_a_run_refuses_naming_the_first_and_a_killed_one_does_not_hold_it(tmp_path):
    dataset = make_dataset(tmp_path)
    config = make_config(dataset, "shared", steps=1_000_000, eval_every=0)
    command = torchrun_command(config, 1)
    first = subprocess.Popen(
        [sys.executable, "-m", "training", *command[command.index("--config"):]], cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_lock_holder(config.run_dir() / LOCK_FILE, first.pid, first)
        # Stopped, it holds the lock for as long as the test needs: running, it could reach the
        # end of the mix plan and exit before the second trainer asks (a loaded machine).
        first.send_signal(signal.SIGSTOP)
        with pytest.raises(
            RunBusy, match=rf"run 'shared' is being trained by another process \(pid {first.pid} on "
        ):
            train(config)  # in this process
        refused = torchrun(config, 2)  # two ranks: both refuse and exit, none waits on the other
        assert refused.returncode != 0
        assert f"run 'shared' is being trained by another process (pid {first.pid} on " in refused.stderr
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()

    # the kernel dropped the dead trainer's lock: the run resumes at once
    durable = newest_durable_step(config) or 0
    result = train(config.model_copy(update={"steps": durable + 2}))
    assert result.step == durable + 2
