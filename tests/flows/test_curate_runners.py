"""One switch, same bytes: the demo's curate (real files of this machine) on the ``local`` runner
and on a Dask ``LocalCluster`` of two worker processes publishes the same dataset version:
every object outside ``reports/`` byte for byte (commit ids, which differ per repository,
masked), the same ``manifest.json`` and the same shard sha256s."""

from __future__ import annotations

import hashlib
import json
import re
import time

import pytest

from flows.curate import curate
from flows.demo_sources import MB, DemoBudget, demo_sources
from flows.params import CurateParams
from formats import layout
from versioning import DataRepo
from versioning.local import LocalRepo

PARTITION_STEPS = (
    "ingest-partition",
    "validate-part",
    "dedup-keys",
    "dedup-verify",
    "dedup-apply",
    "shard-source",
)
pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.slow]


def demo_like(sources: list, repo: str, results: str, runner: dict) -> CurateParams:
    return CurateParams.from_dict(
        {
            "ingest": {"sources": [s.model_dump() for s in sources], "partition_bytes": 48_000},
            "dedup": {"buckets": 3},
            "shards": {"vocab_size": 400, "seq_len": 64, "tokenizer_sample_mb": 0.5},
            "gates": {"min_documents": 10, "min_tokens": 1000, "max_quarantined_fraction": 0.9},
            "repository": {"spec": repo, "results": results},
            "retry": {"retries": 1, "backoff_seconds": 0.05},
            "runner": runner,
        }
    )


def partition_runs(flow_run_id) -> dict[str, int]:
    """Completed task runs of a flow run per partition name (``dedup-keys-3`` -> ``dedup-keys``)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    runs, page = [], None
    with get_client(sync_client=True) as client:
        while page is None or len(page) == 200:
            page = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
                limit=200,
                offset=len(runs),
            )
            runs += page
    names: dict[str, int] = {}
    for run in runs:
        if run.state is not None and run.state.is_completed() and re.fullmatch(r".+-\d+", run.name):
            step = run.name.rsplit("-", 1)[0]
            names[step] = names.get(step, 0) + 1
    return names


def recorded_partition_runs(flow_run_id, steps: tuple[str, ...], patience_s: float = 120.0) -> dict[str, int]:
    """:func:`partition_runs` once the server has recorded every step: task-run states reach it as
    events, which its task-run recorder may write after the flow run has returned. The patience
    only ends a wait that would otherwise hang; the assertion is on the runs."""
    from prefect.events.worker import EventsWorker

    EventsWorker.drain_all()  # this process's events are sent
    deadline = time.monotonic() + patience_s
    while True:
        runs = partition_runs(flow_run_id)
        if all(runs.get(step, 0) >= 2 for step in steps) or time.monotonic() > deadline:
            return runs
        time.sleep(0.2)


def published_objects(repo: DataRepo, tag: str) -> dict[str, bytes]:
    """Every object of the version but the reports (timings, Great Expectations run times), with
    this repository's commit ids (in index folder names, run.json, the manifest) masked."""
    commit_ids = {c.id for c in repo.log(tag)}
    mask = re.compile("|".join(sorted((re.escape(i[:16]) for i in commit_ids), key=len, reverse=True)))
    objects = {}
    for stat in repo.list(tag):
        if stat.path.startswith(f"{layout.REPORTS}/"):
            continue
        data = repo.get(tag, stat.path)
        objects[mask.sub("<commit>", stat.path)] = re.sub(
            rb"<commit>[0-9a-f]*", b"<commit>", mask.sub("<commit>", data.decode("latin-1")).encode("latin-1")
        )
    return objects


def test_local_and_a_two_worker_dask_cluster_publish_the_same_bytes(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENLAKE_HOME", str(tmp_path / "home"))
    budget = DemoBudget(
        code_bytes=MB // 3, prose_bytes=MB // 5, license_bytes=MB // 10, max_file_bytes=40_000
    )
    sources = demo_sources(tmp_path / "demo", budget)
    published = {}
    for name, runner in [("local", {"spec": "local"}), ("dask", {"spec": "dask", "workers": 2})]:
        params = demo_like(sources, str(tmp_path / name), str(tmp_path / f"results-{name}"), runner)
        state = curate(params, return_state=True)
        published[name] = (LocalRepo(tmp_path / name), state.result())
        if name == "dask":
            runs = recorded_partition_runs(state.state_details.flow_run_id, PARTITION_STEPS)
            for step in PARTITION_STEPS:
                assert runs.get(step, 0) >= 2, (
                    f"the {step} partitions are Prefect task runs on the Dask cluster"
                )

    (local_repo, local), (dask_repo, dask) = published["local"], published["dask"]
    local_objects = published_objects(local_repo, local.tag)
    dask_objects = published_objects(dask_repo, dask.tag)
    assert sorted(local_objects) == sorted(dask_objects)
    differing = [path for path in local_objects if local_objects[path] != dask_objects[path]]
    assert differing == [], f"objects that differ between the runners: {differing[:10]}"

    manifests = [json.loads(repo.get(v.tag, layout.MANIFEST)) for repo, v in published.values()]
    shards = [{s["name"]: s["sha256"] for s in m["shards"]} for m in manifests]
    assert shards[0] == shards[1] and len(shards[0]) >= 3, "the same shards, in more than one source"
    for repo, version in published.values():
        for name, sha256 in shards[0].items():
            assert hashlib.sha256(repo.get(version.tag, name)).hexdigest() == sha256
    assert {k: v for k, v in manifests[0].items() if k != "input_commit"} == {
        k: v for k, v in manifests[1].items() if k != "input_commit"
    }
    raw_parts = [p for p in local_objects if p.startswith("raw/")]
    assert len(raw_parts) > len(sources), "several partitions per source ran as separate tasks"

    for stage in layout.STAGES:
        counts = [
            {
                k: json.loads(repo.get(v.tag, layout.report_path(stage)))[k]
                for k in ("documents_in", "kept", "rejected")
            }
            for repo, v in published.values()
        ]
        assert counts[0] == counts[1], f"the {stage} reports count the same documents"
