"""Rollback end to end: the curate flow, the train flow (torchrun), the rollback flow through the
CLI and the real Prefect API, on the local adapter and on the lakeFS API double.

Publish v1, train on it, publish v2 with a deliberately bad source, continue the run on v2, then
``tokenlake rollback --to v1 --resume``: main equals v1 byte for byte, the v2 checkpoints are
listed (Prefect table artifact) and marked but kept, the run resumes from its last v1
checkpoint on the restored main, and every step shows in ``repo log`` and ``lineage``.

After a rollback the reverted version stays reverted (issue 18): training on it is refused
unless asked for, what is trained on it anyway is tainted from the moment it is recorded
(also when its lineage record arrives late) and marked by running the rollback again, and the
next curate run reuses the stages of the version main holds.
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
from flows.restore import plan_rollback, restore_main
from flows.train import TrainParams, train_flow
from flows.wap import MAIN
from formats.layout import STAGES
from tests.flows.curate_support import params_for, stage_outcomes, write_corpus
from tests.flows.lineage_support import (
    BACKENDS,
    BAD_SOURCES,
    GOOD_SOURCES,
    TINY_RUN,
    publish_version,
    train_config,
    train_tiny,
)
from tests.training.helpers import torchrun
from training.config import FaultConfig
from training.lineage import LineageWriter
from training.reverted import RevertedDataRefused
from versioning import open_repo

TINY_RUN_FLAGS = [
    f"--set={key}={value}" for key, value in {
        "global_batch": 8, "micro_batch": 4, "eval_every": 0, "data.heldout_fraction": 0.05,
        "data.eval_sequences": 8, "data.prefetch_batches": 2, "checkpoint.every": 2, "checkpoint.keep_last": 10,
        "checkpoint.async_save": "false", "stability.window": 8, "stability.min_history": 4,
    }.items()
]  # fmt: skip

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
        bad.ingest.sources.append(
            bad.ingest.sources[0].model_copy(update={"name": "scraped", "path": str(scraped)})
        )
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
        assert (resumed["from_checkpoint"], resumed["step"], resumed["data_commit"]) == (
            "alpha@4",
            8,
            report["main"],
        )
        forked = {c.step: c for c in index.of_run(run)}
        assert (
            sorted(forked) == [4, 6, 8] and forked[6].data_commit == forked[8].data_commit == report["main"]
        )
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
        assert [c["checkpoint"] for c in on_v1["checkpoints"]] == [
            "alpha@0",
            "alpha@2",
            "alpha@4",
            f"{run}@4",
        ]
        on_v2 = cli(capsys, "--repo", spec, "lineage", v2.tag)
        assert f"REVERTED     by {report['tag']}" in on_v2 and "alpha@6" in on_v2 and "alpha@8" in on_v2
        restored = json.loads(cli(capsys, "--repo", spec, "lineage", report["tag"], "--json"))
        assert restored["data"]["publish_tag"] == v1.tag and restored["data"]["kind"] == "rollback"
        assert [c["checkpoint"] for c in restored["checkpoints"]] == [f"{run}@6", f"{run}@8"]
        resumed_lineage = cli(capsys, "--repo", spec, "lineage", f"{run}@8", "--step", "5")
        assert "forked from alpha@4" in resumed_lineage and "step 5 read 8 samples" in resumed_lineage


def _checkpoint_rows(body: dict) -> list[tuple]:
    return [(c["checkpoint"], c["tainted"], c["tainted_by"], c["marked"]) for c in body["checkpoints"]]


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_rolled_back_version_stays_rolled_back(backend, tmp_path, capsys, monkeypatch):
    """The sequence of issue 18, through the CLI: three versions, roll back to v1, train on v2."""
    home = tmp_path / "home"
    monkeypatch.setenv("TOKENLAKE_HOME", str(home))
    with BACKENDS[backend](tmp_path) as (repo, spec):
        v1 = publish_version(repo, "curate-1", GOOD_SOURCES, seed=1)
        v2 = publish_version(repo, "curate-2", BAD_SOURCES, seed=2)
        v3 = publish_version(repo, "curate-3", BAD_SOURCES, seed=3)

        # 1. roll back to v1: the two newer versions are reverted, nothing was trained on them
        first = json.loads(cli(capsys, "--repo", spec, "rollback", "--to", v1.tag, "--json"))
        assert first["reverted"] == [v3.commit_id, v2.commit_id] and first["tainted"] == []
        rollback_tag = first["tag"]

        # 2. training on v2 is refused, in one sentence, before torchrun starts
        train = ["--repo", spec, "train", "--dataset", v2.tag, "--run", "late", "--steps", "4", "--retries", "0",
                 *TINY_RUN_FLAGS]  # fmt: skip
        assert tokenlake(train) == 2
        refusal = capsys.readouterr().err
        assert f"data commit {v2.tag} ({v2.commit_id[:12]}) was reverted by {rollback_tag}" in refusal
        assert f"main holds {v1.tag} ({v1.commit_id[:12]}) now" in refusal and "--allow-reverted" in refusal
        assert not (home / "runs" / "late" / "checkpoints").exists(), "no checkpoint was written"

        # 3. on purpose: it trains, and the checkpoints are tainted before any rollback marks them
        cli(capsys, *train, "--allow-reverted")
        on_v2 = json.loads(cli(capsys, "--repo", spec, "lineage", v2.tag, "--json"))
        assert on_v2["data"]["reverted_by"] == [rollback_tag]
        assert _checkpoint_rows(on_v2) == [(f"late@{step}", True, rollback_tag, False) for step in (0, 2, 4)]
        assert f"{rollback_tag} (not marked yet)" in cli(capsys, "--repo", spec, "lineage", v2.tag)
        late = cli(capsys, "--repo", spec, "lineage", "late@4")
        assert f"TAINTED      by {rollback_tag}" in late
        assert "reverted-data" in late, "the choice is an event of the run"
        assert f"trained on data {v2.commit_id[:12]} reverted by {rollback_tag} (allow_reverted)" in late
        # a direct resume of the trainer (no flow around it) is refused the same way
        with pytest.raises(RevertedDataRefused, match=f"was reverted by {rollback_tag}"):
            train_tiny(spec, home, "late", v2.commit_id, steps=6)

        # 4. rolling back to v1 again restores nothing and marks the new checkpoints (kept on disk)
        again = json.loads(cli(capsys, "--repo", spec, "rollback", "--to", v1.tag, "--json"))
        assert (again["method"], again["main"]) == ("none", first["main"]) == ("none", repo.resolve(MAIN))
        assert [(t["checkpoint"], t["tainted_by"]) for t in again["tainted"]] == [
            (f"late@{step}", rollback_tag) for step in (0, 2, 4)
        ]
        on_v2 = json.loads(cli(capsys, "--repo", spec, "lineage", v2.tag, "--json"))
        assert _checkpoint_rows(on_v2) == [(f"late@{step}", True, rollback_tag, True) for step in (0, 2, 4)]
        assert all(Path(c["path"], "COMPLETE").is_file() for c in on_v2["checkpoints"])
        assert tokenlake(["--repo", spec, "rollback", "--to", v1.tag]) == 2
        assert "every checkpoint trained on reverted data is marked" in capsys.readouterr().err


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_lineage_record_queued_during_a_rollback_is_tainted_when_it_arrives(backend, tmp_path, capsys):
    home = tmp_path / "home"
    with BACKENDS[backend](tmp_path) as (repo, spec):
        v1 = publish_version(repo, "curate-1", GOOD_SOURCES, seed=1)
        v2 = publish_version(repo, "curate-2", BAD_SOURCES, seed=2)
        # trained on v2 while the repository was unreachable for lineage: the records wait on this machine
        result = train_tiny(
            spec, home, "offline", v2.commit_id, steps=4, faults=FaultConfig(lineage_outage=True)
        )
        queue = result.run_dir / "lineage-queue"
        assert len(list(queue.glob("*.json"))) == 3 and read_lineage(repo).of_run("offline") == []

        report = json.loads(cli(capsys, "--repo", spec, "rollback", "--to", v1.tag, "--json"))
        assert report["tainted"] == [], "the repository did not know these checkpoints yet"
        checkpoint_dir = result.run_dir / "checkpoints" / "step-0000004"
        assert f"TAINTED      by {report['tag']}" in cli(
            capsys, "--repo", spec, "lineage", str(checkpoint_dir)
        )

        # reachable again: the next run of this name writes the queue first, as this writer does
        assert LineageWriter(lambda: open_repo(spec, create=False), "offline", queue).close()
        on_v2 = json.loads(cli(capsys, "--repo", spec, "lineage", v2.tag, "--json"))
        assert _checkpoint_rows(on_v2) == [
            (f"offline@{step}", True, report["tag"], False) for step in (0, 2, 4)
        ]
        again = json.loads(cli(capsys, "--repo", spec, "rollback", "--to", v1.tag, "--json"))
        assert [t["checkpoint"] for t in again["tainted"]] == ["offline@0", "offline@2", "offline@4"]
        assert all(c.marked for c in read_lineage(repo).of_run("offline"))


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_curate_after_a_rollback_reuses_the_stages_of_the_restored_version(
    backend, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("TOKENLAKE_HOME", str(tmp_path / "home"))
    with BACKENDS[backend](tmp_path) as (repo, spec):
        corpus = write_corpus(tmp_path / "sources", documents=24)
        good = params_for(corpus, spec, tmp_path / "results")
        v1 = curate(good)
        scraped = write_corpus(tmp_path / "scraped", documents=24, seed=99)["prose"]
        bad = good.model_copy(deep=True)
        bad.ingest.sources.append(
            bad.ingest.sources[0].model_copy(update={"name": "scraped", "path": str(scraped)})
        )
        v2 = curate(bad)
        report = json.loads(cli(capsys, "--repo", spec, "rollback", "--to", v1.tag, "--json"))
        assert repo.get_commit(MAIN).metadata["stage"] == "rollback"

        # main's head is the rollback's commit, holding v1: v1's stages are reused, nothing is published
        with stage_outcomes() as outcomes:
            again = curate(good)
        assert outcomes == dict.fromkeys(STAGES, "reused")
        assert (again.tag, again.commit_id, again.new) == (v1.tag, v1.commit_id, False)
        assert repo.resolve(MAIN) == report["main"]
        # the same from an empty stage cache (another machine): the key is the content, found on main
        elsewhere = good.model_copy(
            update={
                "repository": good.repository.model_copy(update={"results": str(tmp_path / "other-results")})
            }
        )
        with stage_outcomes() as outcomes:
            assert curate(elsewhere).tag == v1.tag
        assert outcomes == dict.fromkeys(STAGES, "reused")
        assert sorted(t for t in repo.list_tags() if t.startswith("ds-")) == sorted([v1.tag, v2.tag])


def test_every_rank_of_a_torchrun_job_refuses_reverted_data(tmp_path):
    """Rank 0 judges the data commit and every rank stops with its sentence (none waits for the others)."""
    with BACKENDS["local"](tmp_path) as (repo, spec):
        v1 = publish_version(repo, "curate-1", GOOD_SOURCES, seed=1)
        v2 = publish_version(repo, "curate-2", BAD_SOURCES, seed=2)
        restored = restore_main(repo, plan_rollback(repo, v1.tag), "flow-1")
        done = torchrun(train_config(spec, tmp_path / "home", "ranks", v2.commit_id, steps=2), nproc=2)
        assert done.returncode != 0
        assert done.stderr.count(f"training: error: data commit {v2.tag}") == 2, done.stderr[-3000:]
        assert f"was reverted by {restored.tag}" in done.stderr
