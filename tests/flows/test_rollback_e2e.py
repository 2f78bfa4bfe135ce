"""Rollback end to end: the curate flow, the train flow (torchrun), the rollback flow through the
CLI and the real Prefect API, on the local adapter and on the lakeFS API double.

Publish v1, train on it, publish v2 with a deliberately bad source, continue the run on v2, then
``tokenlake rollback --to v1 --resume``: main equals v1 byte for byte, the v2 checkpoints are
listed (Prefect table artifact) and marked but kept, the run resumes from its last v1
checkpoint on the restored main, and every step shows in ``repo log`` and ``lineage``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

from flows.cli import main as tokenlake
from flows.curate import curate
from flows.lineage import read_lineage
from flows.train import TrainParams, train_flow
from flows.wap import MAIN
from tests.flows.curate_support import params_for, write_corpus
from tests.flows.lineage_support import BACKENDS

TINY_RUN = {
    "global_batch": 8, "micro_batch": 4, "eval_every": 0,
    "data": {"heldout_fraction": 0.05, "eval_sequences": 8, "prefetch_batches": 2},
    "checkpoint": {"every": 2, "keep_last": 10, "async_save": False},
    "stability": {"window": 8, "min_history": 4},
}  # fmt: skip

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.slow]


def cli(capsys, *argv: str) -> str:
    capsys.readouterr()
    assert tokenlake(list(argv)) == 0
    return capsys.readouterr().out


def _artifact(flow_run_id: str, key: str):
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return next(a for a in artifacts if a.key == key)


def _train(spec: str, dataset: str, steps: int, **fields) -> None:
    train_flow(TrainParams(dataset=dataset, run="alpha", steps=steps, repo=spec, retries=0, overrides=TINY_RUN,
                           **fields))  # fmt: skip


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_roll_back_a_bad_version_and_resume_on_the_good_one(backend, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TOKENLAKE_HOME", str(tmp_path / "home"))
    with BACKENDS[backend](tmp_path) as (repo, spec):
        corpus = write_corpus(tmp_path / "sources", documents=24)
        good = params_for(corpus, spec, tmp_path / "results")
        v1 = curate(good)
        _train(spec, v1.tag, steps=4)
        scraped = write_corpus(tmp_path / "scraped", documents=24, seed=99)["prose"]
        bad = good.model_copy(deep=True)
        bad.ingest.sources.append(bad.ingest.sources[0].model_copy(update={"name": "scraped", "path": str(scraped)}))
        v2 = curate(bad)
        assert v2.new and "shards/scraped/" in {s.path[:15] for s in repo.list(v2.tag, "shards/")}
        _train(spec, v2.tag, steps=8, resume="allow-data-change")
        v1_objects = {s.path: repo.get(v1.tag, s.path) for s in repo.list(v1.tag)}

        refused = tokenlake(["--repo", spec, "rollback", "--to", repo.resolve("runs")])
        assert refused == 2 and "is not an ancestor of main" in capsys.readouterr().err

        report = json.loads(cli(capsys, "--repo", spec, "rollback", "--to", v1.tag, "--resume", "--json"))

        # main holds v1's content, byte for byte, through new commits
        assert repo.diff(v1.tag, MAIN) == []
        assert {s.path: repo.get(MAIN, s.path) for s in repo.list(MAIN)} == v1_objects
        assert report["method"] == "revert" and report["reverted"] == [v2.commit_id]
        assert not any(s.path.startswith("shards/scraped/") for s in repo.list(MAIN, "shards/"))
        assert repo.list_tags()[report["tag"]] == repo.resolve(MAIN) == report["main"] != v1.commit_id

        # the v2 checkpoints: listed, marked, kept
        assert [t["checkpoint"] for t in report["tainted"]] == ["alpha@6", "alpha@8"]
        assert all(Path(t["path"], "COMPLETE").is_file() for t in report["tainted"])
        index = read_lineage(repo)
        assert {c.name for c in index.checkpoints if c.tainted} == {"alpha@6", "alpha@8"}
        table = _artifact(report["flow_run_id"], "rollback-tainted")
        rows = json.loads(table.data) if isinstance(table.data, str) else table.data
        assert [row["checkpoint"] for row in rows] == ["alpha@6", "alpha@8"]

        # resumed from the last v1 checkpoint, on the restored main, as a recorded data change
        (resumed,) = report["resumed"]
        run = resumed["run"]
        assert (resumed["from_checkpoint"], resumed["step"], resumed["data_commit"]) == ("alpha@4", 8, report["main"])
        forked = {c.step: c for c in index.of_run(run)}
        assert sorted(forked) == [4, 6, 8] and forked[6].data_commit == forked[8].data_commit == report["main"]
        assert forked[4].data_commit == v1.commit_id and not any(c.tainted for c in forked.values())
        kinds = {(e["run"], e["kind"], e["step"]) for e in index.events}
        assert {("alpha", "data-change", 4), (run, "fork", 4), (run, "data-change", 4)} <= kinds
        start = torch.load(Path(forked[4].checkpoint, "model.pt"), weights_only=True)
        original = torch.load(Path(index.find("alpha", 4).checkpoint, "model.pt"), weights_only=True)
        assert all(torch.equal(start[k], original[k]) for k in original), "resumed from alpha@4's weights"

        # every step is visible from the command line
        log = cli(capsys, "--repo", spec, "repo", "log", MAIN)
        assert f"rollback main to {v1.tag}" in log and f"Revert {v2.commit_id}" in log
        assert "publish " + v2.tag in log, "the bad version stays in history"
        tainted = cli(capsys, "--repo", spec, "lineage", "alpha@8")
        assert f"TAINTED      by {report['tag']}" in tainted and f"published    {v2.tag}" in tainted
        assert "scraped" in tainted, "the sources of the bad version are named"
        on_v1 = json.loads(cli(capsys, "--repo", spec, "lineage", v1.tag, "--json"))
        assert [c["checkpoint"] for c in on_v1["checkpoints"]] == ["alpha@0", "alpha@2", "alpha@4", f"{run}@4"]
        on_v2 = cli(capsys, "--repo", spec, "lineage", v2.tag)
        assert f"REVERTED     by {report['tag']}" in on_v2 and "alpha@6" in on_v2 and "alpha@8" in on_v2
        restored = json.loads(cli(capsys, "--repo", spec, "lineage", report["tag"], "--json"))
        assert restored["data"]["publish_tag"] == v1.tag and restored["data"]["kind"] == "rollback"
        assert [c["checkpoint"] for c in restored["checkpoints"]] == [f"{run}@6", f"{run}@8"]
        resumed_lineage = cli(capsys, "--repo", spec, "lineage", f"{run}@8", "--step", "5")
        assert "forked from alpha@4" in resumed_lineage and "step 5 read 8 samples" in resumed_lineage
