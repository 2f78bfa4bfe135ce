"""The curate flow end to end on the local adapter, with the real stages and the real Prefect API.

One corpus, one repository, runs in sequence: publish; re-run with no change (every stage
reused, nothing new on main); change one stage's config (that stage and the later ones
re-run); change one stage's code (the same); a failing gate (main unchanged, the run branch
deleted by the flow's failure hook).
"""

from __future__ import annotations

import shutil

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    FlowRunFilter,
    FlowRunFilterId,
)

from flows import caching
from flows.curate import curate
from flows.wap import MAIN, PublishRecord
from formats.layout import STAGES
from tasks.stage import config_hash
from tests.flows.curate_support import column, params_for, stage_commits, stage_outcomes, write_corpus
from versioning.local import LocalRepo

pytestmark = pytest.mark.usefixtures("prefect_harness")

ALL_RAN = dict.fromkeys(STAGES, "ran")
ALL_REUSED = dict.fromkeys(STAGES, "reused")


def _artifacts(flow_run_id) -> dict[str, str]:
    """{key: description} of a flow run's artifacts."""
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {a.key: a.description or "" for a in artifacts if a.key}


def _artifact_keys(flow_run_id) -> set[str]:
    return set(_artifacts(flow_run_id))


def _task_names(flow_run_id) -> list[str]:
    """The task runs of a flow run, by task name, in the order they started."""
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return [r.name.rsplit("-", 1)[0] for r in sorted(runs, key=lambda r: r.expected_start_time)]


def _project_copy_with_edited_stage(root, stage: str):
    """The stage code as `flows.caching` reads it, in a copy where one file of ``stage`` changed."""
    for package in caching.CODE_PACKAGES:
        shutil.copytree(
            caching.PROJECT_ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    edited = root / "tasks" / stage / "stage.py"
    edited.write_text(
        edited.read_text() + "\n# an edit: the stage's code is not what made the cached outputs\n"
    )
    return root


def test_publish_rerun_change_one_stage_and_a_failing_gate(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENLAKE_HOME", str(tmp_path / "home"))
    corpus = write_corpus(tmp_path / "sources")
    (corpus["prose"] / "note.txt").write_text(
        "Too short to be an essay: the validate stage quarantines it.\n"
    )
    repo = LocalRepo(tmp_path / "repo")
    params = params_for(corpus, str(repo.root), tmp_path / "results")

    # 1. publish
    with stage_outcomes() as outcomes:
        state = curate(params, return_state=True)
    first = state.result()
    assert outcomes == ALL_RAN and first.new
    assert repo.list_tags()[first.tag] == first.commit_id == repo.resolve(MAIN)
    assert set(repo.list_branches()) == {MAIN}, "the run branch is closed after publishing"
    commits = stage_commits(repo, first.tag)
    configs = {
        "ingest": params.ingest,
        "validate": params.validation,
        "dedup": params.dedup,
        "safety": params.safety,
        "shard": params.shards,
        "mix": params.mix,
    }
    for earlier, stage in zip(STAGES, STAGES[1:], strict=False):
        assert commits[stage]["input_commit"] == commits[earlier]["id"], f"{stage} read {earlier}'s commit"
    for stage in STAGES:
        meta = commits[stage]
        assert meta["flow_run_id"] == str(state.state_details.flow_run_id)
        assert meta["stage_config_hash"] == config_hash(configs[stage])
        assert {"documents_in", "kept", "rejected", "tokens", "tokenlake_version"} <= set(meta)
    record = PublishRecord.from_commit(repo.get_commit(first.commit_id))
    assert [link.stage for link in record.chain] == list(STAGES) and record.run_head == commits["mix"]["id"]
    ids = column(repo, first.tag, "dedup/", "id")
    assert len(ids) == len(set(ids)) > 0
    reasons = {stage: set(column(repo, first.tag, f"quarantine/{stage}/", "reason")) for stage in STAGES[:3]}
    assert reasons["ingest"] and reasons["validate"] and reasons["dedup"], (
        f"the planted empty, binary, too short and duplicate files are quarantined, not dropped: {reasons}"
    )
    flow_run_id = state.state_details.flow_run_id
    assert {"curate-stages", "curate-summary", "curate-progress", "curate-funnel"} <= _artifact_keys(
        flow_run_id
    )
    assert {f"{stage}-stage" for stage in STAGES} | {"shard-progress"} <= _artifact_keys(flow_run_id)
    assert _task_names(flow_run_id) == ["open-run-branch", *STAGES, "publish"], (
        "the graph reads like the pipeline"
    )

    # 2. re-run with no change: every stage reused, main unchanged, the same version returned
    with stage_outcomes() as outcomes:
        rerun = curate(params, return_state=True)
    again = rerun.result()
    assert outcomes == ALL_REUSED
    tables = _artifacts(rerun.state_details.flow_run_id)
    for stage in STAGES:
        assert "reused, computed by run " in tables.get(f"{stage}-stage", ""), (
            f"a cached re-run still shows the {stage} table, saying where it came from: {tables}"
        )
    assert (again.tag, again.commit_id, again.new) == (first.tag, first.commit_id, False)
    assert repo.resolve(MAIN) == first.commit_id and set(repo.list_branches()) == {MAIN}

    # 3. change one stage's config: that stage and the later ones run, on top of the published version
    resharded = params.model_copy(update={"shards": params.shards.model_copy(update={"seq_len": 32})})
    with stage_outcomes() as outcomes:
        second = curate(resharded)
    assert outcomes == {
        "ingest": "reused",
        "validate": "reused",
        "dedup": "reused",
        "safety": "reused",
        "shard": "ran",
        "mix": "ran",
    }
    assert second.new and second.tag != first.tag and repo.resolve(MAIN) == second.commit_id
    assert repo.get_commit(second.commit_id).parents[0] == first.commit_id
    reshard_tag = second.tag
    assert column(repo, second.tag, "dedup/", "id") == ids, "the reused dedup output is the published one"

    # 3b. change one stage's code: that stage and the later ones run again (the cache key holds
    # a hash of the stage's source files, as Prefect's default policy holds a task's source)
    monkeypatch.setattr(caching, "PROJECT_ROOT", _project_copy_with_edited_stage(tmp_path / "code", "dedup"))
    with stage_outcomes() as outcomes:
        recoded = curate(resharded)
    assert outcomes == {
        "ingest": "reused",
        "validate": "reused",
        "dedup": "ran",
        "safety": "ran",
        "shard": "ran",
        "mix": "ran",
    }
    assert recoded.new and repo.resolve(MAIN) == recoded.commit_id
    second = recoded

    # 4. a failing gate: nothing published, the run branch deleted by the flow's on_failure hook
    failing = resharded.model_copy(
        update={"gates": resharded.gates.model_copy(update={"min_tokens": 10**12})}
    )
    state = curate(failing, return_state=True)
    assert state.is_failed() and "min_tokens" in state.message
    assert repo.resolve(MAIN) == second.commit_id and set(repo.list_branches()) == {MAIN}
    assert {t for t in repo.list_tags() if t.startswith("ds-")} == {first.tag, reshard_tag, second.tag}
