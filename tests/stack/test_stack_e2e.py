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
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.services.stack import Stack
from flows.wap import RUN_BRANCH_PREFIX
from formats.shards import Manifest
from tests.flows.curate_support import params_for, write_corpus
from versioning import NotFound
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


def _published(repo: LakeFSRepo, ref: str) -> tuple:
    manifest = Manifest.model_validate_json(repo.get(ref, "shards/manifest.json"))
    return [(s.name, s.sha256) for s in manifest.shards], manifest.totals


def test_the_prefect_server_killed_during_a_run_and_restarted(stack, tmp_path):
    # One of two outcomes, as for every fault: the run finishes and publishes what a fault-free
    # run publishes, or it ends failed or crashed with main untouched, and a re-run publishes it.
    env = dict(stack.stack.tokenlake_environment())
    corpus = write_corpus(tmp_path / "sources")
    repos = {}
    for side in ("reference", "killed"):
        name = f"stack-{side}-{uuid.uuid4().hex[:6]}"
        repos[side] = (name, LakeFSRepo.connect(
            env["LAKECTL_SERVER_ENDPOINT_URL"], env["LAKECTL_CREDENTIALS_ACCESS_KEY_ID"],
            env["LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY"], name,
        ))  # fmt: skip
    server = stack.prefect_server
    with temporary_settings({PREFECT_API_URL: stack.prefect_api}):
        name, reference = repos["reference"]
        params = params_for(corpus, f"lakefs://{name}", tmp_path / "results-reference")
        _run_deployment("curate/curate-nightly", {"params": params.model_dump(mode="json")})
        (tag,) = [t for t in reference.list_tags() if t.startswith("ds-")]
        expected = _published(reference, tag)

        name, killed = repos["killed"]
        params = params_for(corpus, f"lakefs://{name}", tmp_path / "results-killed")
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name("curate/curate-nightly")
            run = client.create_flow_run_from_deployment(
                deployment.id, parameters={"params": params.model_dump(mode="json")}
            )
        _wait_for_a_stage_commit(killed, "ingest")
        server.kill()  # SIGKILL, mid-run
        server.start()
        state = _final_state(run.id)
        print(f"\nPrefect server SIGKILLed after the ingest commit: the run ended {state.name}")
        if not state.is_completed():
            assert not killed.exists("main", "shards/manifest.json"), "a failed run left a dataset on main"
            _run_deployment("curate/curate-nightly", {"params": params.model_dump(mode="json")})
    tags = [t for t in killed.list_tags() if t.startswith("ds-")]
    assert len(tags) == 1 and _published(killed, tags[0]) == expected


def _wait_for_a_stage_commit(repo: LakeFSRepo, stage: str) -> None:
    give_up = time.monotonic() + WAIT_LIMIT_S
    while time.monotonic() < give_up:
        try:
            for branch, head in repo.list_branches().items():
                if (
                    branch.startswith(RUN_BRANCH_PREFIX)
                    and repo.get_commit(head).metadata.get("stage") == stage
                ):
                    return
        except NotFound:
            pass  # the run has not made the repository yet
        time.sleep(0.05)
    raise AssertionError(f"no {stage} commit on a run branch of {repo.name} within {WAIT_LIMIT_S} s")


def test_four_curate_runs_at_once_publish_in_turn_or_refuse_and_trainers_stream_beside_them(stack, tmp_path):
    # Four runs of four configurations on one repository, started together through the API: each
    # publishes in turn (the lock) or refuses in one sentence; no publish is lost (every tag's
    # merge is on main's history). Two trainers stream a published version meanwhile.
    env = dict(stack.stack.tokenlake_environment())
    name = f"stack-load-{uuid.uuid4().hex[:6]}"
    spec = f"lakefs://{name}"
    repo = LakeFSRepo.connect(
        env["LAKECTL_SERVER_ENDPOINT_URL"], env["LAKECTL_CREDENTIALS_ACCESS_KEY_ID"],
        env["LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY"], name,
    )  # fmt: skip
    corpus = write_corpus(tmp_path / "sources")
    endpoint = f"http://127.0.0.1:{stack.stack.ports.lakefs}"
    with temporary_settings({PREFECT_API_URL: stack.prefect_api}):
        seed = params_for(corpus, spec, tmp_path / "results-0")
        _run_deployment("curate/curate-nightly", {"params": seed.model_dump(mode="json")})
        (seeded,) = [t for t in repo.list_tags() if t.startswith("ds-")]
        before = lakefs_requests(endpoint)
        started = time.monotonic()
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name("curate/curate-nightly")
            curates = [
                client.create_flow_run_from_deployment(
                    deployment.id,
                    parameters={"params": params_for(
                        corpus, spec, tmp_path / f"results-{i}", dedup={"threshold": threshold}
                    ).model_dump(mode="json")},
                )
                for i, threshold in enumerate((0.6, 0.7, 0.75, 0.9), start=1)
            ]  # fmt: skip
            trainers = [
                client.create_flow_run_from_deployment(
                    client.read_deployment_by_name("train/train").id,
                    parameters={"params": {"dataset": seeded, "run": f"load-{i}-{uuid.uuid4().hex[:4]}",
                                           "steps": 4, "repo": spec}},
                )
                for i in range(2)
            ]  # fmt: skip
        states = [_final_state(run.id) for run in curates + trainers]
        seconds = time.monotonic() - started
        done = lakefs_requests(endpoint) - before
    for run, state in zip(curates, states[:4], strict=True):
        if not state.is_completed():
            refusal = state.message.strip()
            assert (
                "main moved while this run was curating" in refusal
                or "another publish holds the lock" in refusal
            ), (run.id, refusal)
    assert all(state.is_completed() for state in states[4:]), [s.message for s in states[4:]]
    tags = [t for t in repo.list_tags() if t.startswith("ds-")]
    published = sum(state.is_completed() for state in states[:4])
    assert published >= 1 and 1 < len(tags) <= 1 + published, (published, tags)
    main_history = {c.id for c in repo.log("main")}
    assert all(commit in main_history for commit in repo.list_tags().values())  # no publish lost
    print(f"\n4 curate runs at once: {published} published, {4 - published} refused; 2 trainers Completed; "
          f"lakeFS served {done.count / seconds:.1f} requests/s, p99 {done.p99_s * 1000:.0f} ms (server-side)")  # fmt: skip


@dataclass
class Requests:
    """lakeFS's own request histogram (``api_request_duration_seconds``), summed over operations."""

    count: int
    buckets: dict[float, int]

    def __sub__(self, other: Requests) -> Requests:
        return Requests(
            self.count - other.count, {le: n - other.buckets.get(le, 0) for le, n in self.buckets.items()}
        )

    @property
    def p99_s(self) -> float:
        """The smallest bucket bound that holds 99% of the requests."""
        for le in sorted(self.buckets):
            if self.buckets[le] >= 0.99 * self.count:
                return le
        return float("inf")


_BUCKET = re.compile(r'^api_request_duration_seconds_bucket\{.*le="([^"]+)".*\} (\d+)$')
_COUNT = re.compile(r"^api_request_duration_seconds_count\{.*\} (\d+)$")


def lakefs_requests(endpoint: str) -> Requests:
    with urllib.request.urlopen(f"{endpoint}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    buckets: dict[float, int] = {}
    count = 0
    for line in text.splitlines():
        if match := _BUCKET.match(line):
            le = float(match[1])
            buckets[le] = buckets.get(le, 0) + int(match[2])
        elif match := _COUNT.match(line):
            count += int(match[1])
    return Requests(count, buckets)
