"""The curate flow on lakeFS: on the API double with faults, and on a real lakeFS server.

Published under injected faults: 503s and dropped connections on a fifth of the requests all
run long (the adapter retries them), and a total outage while the shard stage writes that outlasts
the adapter's retries, so the Prefect task fails and its retry (with backoff) redoes the stage. Every document is still there exactly once. Then: re-run with no change, change one
stage's config, a failing gate.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
import uuid

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

from flows import publish_guard
from flows.curate import curate
from flows.wap import MAIN, RUN_BRANCH_PREFIX, flow_run_of_branch
from formats.layout import STAGES
from formats.shards import Manifest
from tests.flows.curate_support import column, params_for, stage_outcomes, write_corpus
from tests.lakefs_double import FaultConfig, LakeFSDouble
from tests.lakefs_real import real_lakefs
from versioning import HookFailed, NotFound
from versioning.lakefs import LakeFSRepo, RetryPolicy

pytestmark = pytest.mark.usefixtures("prefect_harness")

REPOSITORY = "curate-e2e"
BACKGROUND_FAULTS = FaultConfig(error_rate=0.1, drop_rate=0.1, seed=7)
OUTAGE = FaultConfig(error_rate=1.0)


@pytest.fixture
def double(tmp_path, monkeypatch):
    with LakeFSDouble(tmp_path / "lakefs", faults=BACKGROUND_FAULTS) as double:
        monkeypatch.setenv("LAKECTL_SERVER_ENDPOINT_URL", double.endpoint)
        monkeypatch.setenv("LAKECTL_CREDENTIALS_ACCESS_KEY_ID", double.access_key_id)
        monkeypatch.setenv("LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY", double.secret_access_key)
        monkeypatch.setenv("LAKECTL_CONFIG_FILE", str(tmp_path / "no-lakectl.yaml"))
        yield double
        assert double.violations == [], "\n".join(double.violations)


def _outage_mid_shard(double: LakeFSDouble, probe: LakeFSRepo, done: threading.Event, fired: list) -> None:
    """Cut lakeFS off once the shard stage has written its tokenizer (uncommitted), and keep it
    off until the shard stage has failed once (its task run waits for a retry): an event, not a
    duration, since on a loaded machine the stage may tokenize for longer than any fixed outage
    without calling lakeFS at all."""
    while not done.is_set():
        try:
            writing = [
                branch
                for branch, head in probe.list_branches().items()
                if branch.startswith(RUN_BRANCH_PREFIX)
                and probe.get_commit(head).metadata.get("stage") == "safety"  # the stage before shard
                and probe.exists(branch, "tokenizer/tokenizer.json")
            ]
        except NotFound:  # the repository or the branch does not exist (yet, or any more)
            writing = []
        for branch in writing:
            double.faults = OUTAGE
            fired.append(branch)
            flow_run_id = flow_run_of_branch(branch)
            while not done.is_set() and not _shard_failed_once(flow_run_id):
                done.wait(0.2)
            double.faults = BACKGROUND_FAULTS
            return
        done.wait(0.02)


def _shard_failed_once(flow_run_id: str) -> bool:
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return any(
        r.name.startswith("shard")
        and (r.run_count > 1 or (r.state is not None and r.state.name == "AwaitingRetry"))
        for r in runs
    )


def _attempts(flow_run_id) -> dict[str, int]:
    """Task name -> attempts, once the API has processed every task-run event of the run."""
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
            )
            if runs and all(r.state and r.state.is_final() for r in runs):
                return {r.name.rsplit("-", 1)[0]: r.run_count for r in runs}
            time.sleep(0.2)


def _assert_every_document_once(repo, ref: str, files: int) -> None:
    """Each stage's documents in = kept + quarantined, by id, and ingest saw every file once."""
    raw, q_ingest = column(repo, ref, "raw/", "id"), column(repo, ref, "quarantine/ingest/", "id")
    assert len(raw) + len(q_ingest) == len(set(raw) | set(q_ingest)) == files
    for stage, kept_prefix, previous in (("validate", "filtered/", raw), ("dedup", "dedup/", None)):
        previous = previous if previous is not None else column(repo, ref, "filtered/", "id")
        kept, rejected = column(repo, ref, kept_prefix, "id"), column(repo, ref, f"quarantine/{stage}/", "id")
        assert len(kept) + len(rejected) == len(previous) and set(kept) | set(rejected) == set(previous), (
            stage
        )


@pytest.mark.slow
def test_curate_on_lakefs_survives_faults_then_reuses_and_gates(double, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENLAKE_HOME", str(tmp_path / "home"))
    corpus = write_corpus(tmp_path / "sources")
    files = sum(1 for path in corpus.values() for _ in path.iterdir())
    params = params_for(
        corpus,
        f"lakefs://{REPOSITORY}",
        tmp_path / "results",
        retry={"retries": 4, "backoff_seconds": 1.0, "jitter_factor": 0.5},
    )
    probe = LakeFSRepo.connect(
        double.endpoint,
        double.access_key_id,
        double.secret_access_key,
        REPOSITORY,
        retry=RetryPolicy(attempts=20, base_delay_s=0.01, max_delay_s=0.1),
    )

    done, fired = threading.Event(), []
    outage = threading.Thread(target=_outage_mid_shard, args=(double, probe, done, fired), daemon=True)
    outage.start()
    try:
        state = curate(params, return_state=True)
    finally:
        done.set()
        outage.join()
    first = state.result()
    assert fired, "the outage happened during the run"
    assert double.injected["error"] > 0 and double.injected["drop_after"] > 0
    attempts = _attempts(state.state_details.flow_run_id)
    assert attempts["shard"] > 1, f"the outage failed the shard stage, a retry redid it: {attempts}"
    double.faults = FaultConfig()
    assert probe.list_tags()[first.tag] == first.commit_id == probe.resolve(MAIN)
    assert set(probe.list_branches()) == {MAIN}
    _assert_every_document_once(probe, first.tag, files)

    with stage_outcomes() as outcomes:
        again = curate(params)
    assert outcomes == dict.fromkeys(STAGES, "reused") and (again.commit_id, again.new) == (
        first.commit_id,
        False,
    )

    remixed = params.model_copy(update={"mix": params.mix.model_copy(update={"seed": 1})})
    with stage_outcomes() as outcomes:
        second = curate(remixed)
    assert outcomes == {**dict.fromkeys(STAGES[:-1], "reused"), "mix": "ran"} and second.new
    assert probe.resolve(MAIN) == second.commit_id

    failing = remixed.model_copy(update={"gates": remixed.gates.model_copy(update={"min_documents": 10**9})})
    state = curate(failing, return_state=True)
    assert state.is_failed() and "min_documents" in state.message
    assert probe.resolve(MAIN) == second.commit_id and set(probe.list_branches()) == {MAIN}

    # the flow published through main's guard (installed by its first run); lakeFS refuses what
    # another client merges without the gates
    assert publish_guard.missing_files(probe) == []
    probe.create_branch("by-hand", MAIN)
    probe.put("by-hand", "shards/extra/shard-00000.bin", b"unchecked")
    probe.commit("by-hand", "shards uploaded by hand")
    with pytest.raises(HookFailed, match="refused by the tokenlake publish guard"):
        probe.merge("by-hand", MAIN, "merge by hand")
    assert probe.resolve(MAIN) == second.commit_id


@pytest.fixture
def real_lakefs_repository(tmp_path, monkeypatch):
    """A repository name on the session's real lakeFS, with the lakectl variables pointing at it."""
    server = real_lakefs()
    for name, value in server.lakectl_environment().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LAKECTL_CONFIG_FILE", str(tmp_path / "no-lakectl.yaml"))
    name = f"curate-{uuid.uuid4().hex[:12]}"
    yield server.connect(name)
    with contextlib.suppress(NotFound):
        server.connect(name)._repo.delete()


@pytest.mark.slow
def test_curate_on_a_real_lakefs_publishes_reuses_and_is_guarded_by_lakefs(
    real_lakefs_repository, tmp_path, monkeypatch
):
    probe = real_lakefs_repository
    monkeypatch.setenv("TOKENLAKE_HOME", str(tmp_path / "home"))
    corpus = write_corpus(tmp_path / "sources")
    files = sum(1 for path in corpus.values() for _ in path.iterdir())
    params = params_for(corpus, f"lakefs://{probe.name}", tmp_path / "results")

    first = curate(params)
    assert probe.list_tags()[first.tag] == first.commit_id == probe.resolve(MAIN)
    assert set(probe.list_branches()) == {MAIN}
    _assert_every_document_once(probe, first.tag, files)
    manifest = Manifest.model_validate_json(probe.get(first.tag, "shards/manifest.json"))
    for shard in manifest.shards:
        assert hashlib.sha256(probe.get(first.tag, shard.name)).hexdigest() == shard.sha256

    with stage_outcomes() as outcomes:
        again = curate(params)
    assert outcomes == dict.fromkeys(STAGES, "reused")
    assert (again.commit_id, again.new) == (first.commit_id, False)

    failing = params.model_copy(update={"gates": params.gates.model_copy(update={"min_documents": 10**9})})
    state = curate(failing, return_state=True)
    assert state.is_failed() and "min_documents" in state.message
    assert probe.resolve(MAIN) == first.commit_id and set(probe.list_branches()) == {MAIN}

    # The flow installed main's guard on its first run; lakeFS itself runs it on a merge by hand.
    assert publish_guard.missing_files(probe) == []
    probe.create_branch("by-hand", MAIN)
    probe.put("by-hand", "shards/extra/shard-00000.bin", b"unchecked")
    probe.commit("by-hand", "shards uploaded by hand")
    with pytest.raises(HookFailed, match="refused by the tokenlake publish guard"):
        probe.merge("by-hand", MAIN, "merge by hand")
    assert probe.resolve(MAIN) == first.commit_id
