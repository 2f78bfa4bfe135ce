"""What the Prefect UI does, through Prefect's own client, against `tokenlake serve`.

`tokenlake serve` runs as a subprocess: it registers deploy/prefect.yaml with `prefect deploy`
and runs a process worker for its pool. The test then does what a person does in the UI:
starts a curate run with custom parameters (the form), and retries a failed run (the Retry
button sets the run to AwaitingRetry), which completes and reuses the stages its failed
attempt finished.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.settings import PREFECT_API_URL
from prefect.states import Scheduled

from flows.deployments import ServeError, ensure_process_pools, work_pools
from tests.flows.curate_support import params_for, write_corpus
from tests.flows.serve_support import WAIT_LIMIT_S, deployment_id, final_state, start_serve
from versioning.local import LocalRepo

pytestmark = pytest.mark.usefixtures("prefect_harness")

PREFECT_YAML = Path(__file__).resolve().parents[2] / "deploy" / "prefect.yaml"


def test_prefect_yaml_declares_curate_nightly_janitor_and_train_in_one_pool(tmp_path):
    assert work_pools(PREFECT_YAML) == dict.fromkeys(
        ["curate-nightly", "janitor-hourly", "train"], "tokenlake"
    )
    poolless = tmp_path / "prefect.yaml"
    poolless.write_text("deployments:\n  - name: x\n    entrypoint: flows/curate.py:curate\n")
    with pytest.raises(ServeError, match="deployment 'x' names no work_pool"):
        work_pools(poolless)


@pytest.fixture
def served(tmp_path):
    """`tokenlake serve` in a subprocess, talking to the test's Prefect API."""
    process = start_serve(PREFECT_YAML, tmp_path)
    try:
        yield deployment_id("curate/curate-nightly", process, tmp_path)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _task_states(flow_run_id: UUID, attempt: int) -> dict[str, str]:
    """Task name -> state name, for the task runs of one attempt of a flow run."""
    give_up = time.monotonic() + WAIT_LIMIT_S
    with get_client(sync_client=True) as client:
        while time.monotonic() < give_up:
            runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
            )
            runs = [r for r in runs if r.flow_run_run_count == attempt]
            if runs and all(r.state and r.state.is_final() for r in runs):
                return {r.name.rsplit("-", 1)[0]: r.state.name for r in runs}
            time.sleep(0.5)
    raise AssertionError(f"task runs of flow run {flow_run_id} did not finish within {WAIT_LIMIT_S} s")


@pytest.mark.slow
def test_a_custom_run_completes_and_a_failed_run_retried_reuses_its_finished_stages(served, tmp_path):
    deployment_id = served
    corpus = write_corpus(tmp_path / "sources")
    repo = LocalRepo(tmp_path / "repo")
    params = params_for(corpus, str(repo.root), tmp_path / "results")

    with get_client(sync_client=True) as client:
        run = client.create_flow_run_from_deployment(
            deployment_id, parameters={"params": params.model_dump(mode="json")}
        )
    assert final_state(run.id).is_completed()
    (first_tag,) = [t for t in repo.list_tags() if t.startswith("ds-")]

    # The next run reuses a tokenizer tag that does not exist yet: the shard stage fails.
    wanting = params.model_copy(
        update={
            "dedup": params.dedup.model_copy(update={"threshold": 0.7}),
            "shards": params.shards.model_copy(update={"reuse_tokenizer_from": "tokenizer-v1"}),
        }
    )
    with get_client(sync_client=True) as client:
        run = client.create_flow_run_from_deployment(
            deployment_id, parameters={"params": wanting.model_dump(mode="json")}
        )
    assert final_state(run.id).is_failed()
    failed_attempt = _task_states(run.id, attempt=1)
    assert failed_attempt["dedup"] == "Completed" and failed_attempt["shard"] == "Failed"
    assert repo.list_tags().keys() == {first_tag}, "the failed run published nothing"

    repo.create_tag("tokenizer-v1", first_tag)  # the fix, then the UI's Retry button
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.id, Scheduled(name="AwaitingRetry", message="Retry from the UI"))
    assert final_state(run.id, not_before_run=2).is_completed()
    retried = _task_states(run.id, attempt=2)
    assert {s: retried[s] for s in ("ingest", "validate", "dedup", "safety")} == dict.fromkeys(
        ("ingest", "validate", "dedup", "safety"), "Cached"
    )
    assert retried["shard"] == retried["mix"] == "Completed"
    with get_client(sync_client=True) as client:
        every = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
    # the failed attempt: open-run-branch + ingest..shard; the retry: open-run-branch + 6 stages + publish
    assert len(every) == 6 + 8, sorted(r.name for r in every)
    assert len([t for t in repo.list_tags() if t.startswith("ds-")]) == 2


def test_prefect_deploy_registers_them_with_a_work_pool(tmp_path):
    """What `tokenlake serve` and deploy/compose.yaml run: `prefect deploy --all` into the process pool."""
    ensure_process_pools({"tokenlake"})
    env = os.environ | {
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "TOKENLAKE_ROOT": str(PREFECT_YAML.parents[1]),
    }
    deploy = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefect",
            "--no-prompt",
            "deploy",
            "--all",
            "--prefect-file",
            str(PREFECT_YAML),
        ],
        env=env,
        cwd=PREFECT_YAML.parents[1],
        capture_output=True,
        text=True,
    )
    assert deploy.returncode == 0, deploy.stdout[-2000:] + deploy.stderr[-2000:]
    with get_client(sync_client=True) as client:
        nightly = client.read_deployment_by_name("curate/curate-nightly")
        janitor = client.read_deployment_by_name("janitor/janitor-hourly")
        train = client.read_deployment_by_name("train/train")
    assert nightly.work_pool_name == "tokenlake" and nightly.schedules[0].schedule.cron == "0 2 * * *"
    assert janitor.schedules[0].schedule.cron == "17 * * * *"
    assert not train.schedules, "training runs when asked, not on a clock"
    assert nightly.pull_steps == [
        {"prefect.deployments.steps.set_working_directory": {"directory": str(PREFECT_YAML.parents[1])}}
    ], "the pull step is registered, {{ $TOKENLAKE_ROOT }} resolved by prefect deploy"
