"""The production stack of ``deploy/compose.yaml``, started natively (``./dev stack up``), end to end.

PostgreSQL (Debian's package) holds lakeFS's KV store and the Prefect server's database; MinIO is
lakeFS's blockstore; ``prefect deploy`` registers ``deploy/prefect.yaml`` as the compose file's
one-shot service does, and a process worker runs the flow runs. Through those real services only:
two curate runs are triggered through the Prefect API as the UI's "Run" button does (custom
parameters) and publish to ``lakefs://`` on S3; the train deployment trains on the second tag,
streaming its shards from lakeFS; ``tokenlake rollback`` restores the first version and marks the
checkpoints trained on the second as tainted; ``tokenlake lineage`` answers for that checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.services.stack import Stack
from tests.flows.curate_support import params_for, write_corpus
from versioning.lakefs import LakeFSRepo

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WAIT_LIMIT_S = 1800  # a safety net against a hang, not a timing: every wait below is for a state


@pytest.fixture(scope="module")
def stack():
    workdir = Path(tempfile.mkdtemp(prefix="tokenlake-stack-"))
    stack = Stack(workdir)
    running = stack.up()
    try:
        yield running
    finally:
        running.stop()
        running.postgres.remove()
        shutil.rmtree(workdir, ignore_errors=True)


def _final_state(flow_run_id: UUID):
    give_up = time.monotonic() + WAIT_LIMIT_S
    with get_client(sync_client=True) as client:
        while time.monotonic() < give_up:
            run = client.read_flow_run(flow_run_id)
            if run.state and run.state.is_final():
                return run.state
            time.sleep(0.5)
    raise AssertionError(f"flow run {flow_run_id} did not finish within {WAIT_LIMIT_S} s")


def _run_deployment(name: str, parameters: dict):
    """What the UI's Run button (custom run) does: a flow run of the deployment, for the worker."""
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(name)
        run = client.create_flow_run_from_deployment(deployment.id, parameters=parameters)
    state = _final_state(run.id)
    assert state.is_completed(), f"{name}: {state.name}: {state.message}"
    return run


def _tokenlake(env: dict, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", *args, "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"tokenlake {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout)


def test_curate_train_rollback_and_lineage_through_the_stack(stack, tmp_path):
    env = dict(stack.stack.tokenlake_environment())
    name = f"stack-{uuid.uuid4().hex[:8]}"
    spec = f"lakefs://{name}"
    lakefs = LakeFSRepo.connect(
        env["LAKECTL_SERVER_ENDPOINT_URL"],
        env["LAKECTL_CREDENTIALS_ACCESS_KEY_ID"],
        env["LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY"],
        name,
    )
    corpus = write_corpus(tmp_path / "sources")
    good = params_for(corpus, spec, tmp_path / "results")
    changed = params_for(corpus, spec, tmp_path / "results", dedup={"threshold": 0.7})
    with temporary_settings({PREFECT_API_URL: stack.prefect_api}):
        _run_deployment("curate/curate-nightly", {"params": good.model_dump(mode="json")})
        (first,) = [t for t in lakefs.list_tags() if t.startswith("ds-")]
        _run_deployment("curate/curate-nightly", {"params": changed.model_dump(mode="json")})
        (second,) = [t for t in lakefs.list_tags() if t.startswith("ds-") and t != first]
        assert lakefs.list_tags()[second] == lakefs.resolve("main")
        assert lakefs._sdk.repositories_api.get_repository(name).storage_namespace.startswith("s3://")

        run = f"stack-{uuid.uuid4().hex[:6]}"
        train = {
            "dataset": second,
            "run": run,
            "steps": 4,
            "repo": spec,
            "overrides": {"checkpoint": {"every": 2}},
        }
        _run_deployment("train/train", {"params": train})

    cli_env = os.environ | env
    before = _tokenlake(cli_env, "--repo", spec, "lineage", f"{run}@4")["checkpoint"]
    assert before["data_commit"] == lakefs.list_tags()[second] and not before["tainted"], before

    report = _tokenlake(cli_env, "--repo", spec, "rollback", "--to", first)
    assert report["main"] == lakefs.resolve("main") != report["previous_main"]
    assert run in json.dumps(report["tainted"])
    after = _tokenlake(cli_env, "--repo", spec, "lineage", f"{run}@4")["checkpoint"]
    assert after["data_commit"] == before["data_commit"]
    assert after["tainted"] and after["tainted_by"] == report["tag"], after
