"""Training streams shards from lakeFS: from a misbehaving one (the API double with faults) it
waits, says why, never crashes, and finishes bit for bit as on a healthy repository (issue 19,
item 3); from a real lakeFS server it finishes bit for bit too.

The outage starts at an event, the first request for a shard the run needs half-way, and
lasts until the trainer has reported that it waits on the unreachable repository plus
``TOKENLAKE_TEST_OUTAGE_S`` seconds (default 15; CI may shorten it).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch

from formats.shards import Manifest
from tests.flows.lineage_support import lakectl_environment
from tests.lakefs_double import FaultConfig, LakeFSDouble
from tests.lakefs_real import real_lakefs
from tests.training.helpers import make_dataset, train_records
from tests.versioning.lakefs_backends import connect
from training.config import (
    CheckpointConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    StabilityConfig,
    TrainConfig,
)
from training.data import DataError, ShardCache, batch_positions, open_dataset
from training.metrics import read_metrics
from training.synthetic import publish_synthetic_dataset
from training.trainer import train
from versioning.local import LocalRepo

OUTAGE_S = float(os.environ.get("TOKENLAKE_TEST_OUTAGE_S", "15"))
FAULTS = FaultConfig(error_rate=0.1, drop_rate=0.1, seed=1919)  # 20% of requests fail
OUTAGE = FaultConfig(drop_rate=1.0)  # every connection dropped
SOURCES = {"web": 600, "code": 400}
SHARDS_PER_SOURCE = 30
STEPS = 24


def config(run: str, home: Path, repo: str, commit: str, **data) -> TrainConfig:
    return TrainConfig(
        run=run, commit=commit, repo=repo, home=str(home), steps=STEPS, global_batch=4, micro_batch=2,
        model=ModelConfig.preset("tiny"), optim=OptimConfig(lr=1e-2, min_lr=1e-3, warmup_steps=2),
        data=DataConfig(heldout_fraction=0.05, eval_sequences=8, prefetch_batches=2, fetch_ahead_steps=2,
                        wait_warning_s=0.5, fetch_timeout_s=900, **data),
        checkpoint=CheckpointConfig(every=8, keep_last=2), stability=StabilityConfig(window=8, min_history=4),
        eval_every=12, progress=False, report=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    """The same dataset in a local repository, and the losses of a run on it (the reference)."""
    home = tmp_path_factory.mktemp("healthy")
    ds = make_dataset(home, sources=SOURCES, shards_per_source=SHARDS_PER_SOURCE)
    reference = config("healthy", home, str(ds.repo), ds.commit, loader="thread")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as every training test: module fixtures run before the autouse one
    try:
        train(reference)
    finally:
        torch.set_num_threads(threads)
    return ds, [r["loss"] for r in train_records(reference.run_dir())]


def shard_first_needed_at(ds, step: int) -> str:
    """A shard that no step before ``step`` reads and step ``step`` does (from the sample order alone)."""
    _, dataset = open_dataset(
        LocalRepo(ds.repo),
        str(ds.repo),
        ds.commit,
        ShardCache(ds.home / "plan-cache"),
        0.05,
        True,
        lambda: None,
    )
    seen, cursor = set(), 0
    for k in range(1, STEPS + 1):
        positions, cursor = batch_positions(dataset, cursor, 4, [])
        source, _, index = dataset.plan.locate(positions)
        names = {dataset.entries[s].name for s in dataset.shard_numbers(source, index).tolist()}
        if k >= step and names - seen:
            return sorted(names - seen)[0]
        seen |= names
    raise AssertionError("every shard is read before that step")


class Outage:
    """Drops every connection from the first request for ``target`` until the trainer has said
    it waits on the unreachable repository, and ``seconds`` more."""

    def __init__(self, double: LakeFSDouble, target: str, metrics: Path, seconds: float):
        self.double, self.target, self.metrics, self.seconds = double, target, metrics, seconds
        self.started, self.ended = threading.Event(), threading.Event()
        self.injected_before = 0
        self.warning: dict | None = None
        double.on_request = self.on_request
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def on_request(self, operation: str, query: dict) -> None:
        if (
            not self.started.is_set()
            and operation in ("statObject", "getObject")
            and query.get("path") == [self.target]
        ):
            self.started.set()
            self.injected_before = sum(self.double.injected.values())
            self.double.faults = OUTAGE

    def run(self) -> None:
        self.started.wait()
        while not self.ended.is_set() and self.warning is None:
            records = read_metrics(self.metrics) if self.metrics.exists() else []
            self.warning = next(
                (r for r in records if r["kind"] == "data_wait" and "unreachable" in r["reason"]), None
            )
            time.sleep(0.05)
        self.ended.wait(self.seconds)
        self.end()

    def end(self) -> None:
        if not self.ended.is_set():
            self.double.faults = FAULTS
            self.ended.set()


@pytest.mark.slow
def test_training_waits_out_faults_and_an_outage_says_why_and_finishes_bit_exact(healthy, tmp_path):
    ds, reference_losses = healthy
    target = shard_first_needed_at(ds, STEPS // 2)
    with LakeFSDouble(tmp_path / "double") as double, lakectl_environment(double):
        repo = connect(double, repository="stream")
        repo.ensure()
        commit = publish_synthetic_dataset(
            repo,
            "main",
            SOURCES,
            seq_len=32,
            vocab_size=256,
            total_samples=1200,
            shards_per_source=SHARDS_PER_SOURCE,
        )
        double.faults = FAULTS
        run = config("over-lakefs", tmp_path / "home", "lakefs://stream", commit)
        outage = Outage(double, target, run.run_dir() / "metrics.jsonl", OUTAGE_S)
        try:
            train(run)
        finally:
            outage.end()
        assert double.violations == [], double.violations
        injected = outage.injected_before + sum(double.injected.values())

    records = train_records(run.run_dir())
    assert [r["loss"] for r in records] == reference_losses  # bit for bit
    assert outage.started.is_set() and outage.warning is not None
    assert "shards/" in outage.warning["reason"], outage.warning  # names the shard it cannot fetch
    waited = next(r for r in records if r["step"] == outage.warning["step"])["data_wait_ms"]
    assert waited >= 1000 * OUTAGE_S  # it was already waiting when the last OUTAGE_S seconds began
    assert injected > 0
    print(
        f"\n{injected} faults injected besides a {OUTAGE_S:.0f} s outage from the first read of {target}; "
        f"step {outage.warning['step']} waited {waited / 1000:.1f} s: {outage.warning['message']}"
    )


def test_a_shard_failing_verification_twice_stops_the_run_naming_it(healthy, tmp_path):
    ds, _ = healthy
    target = shard_first_needed_at(ds, 1)
    with LakeFSDouble(tmp_path / "double") as double, lakectl_environment(double):
        repo = connect(double, repository="broken")
        repo.ensure()
        publish_synthetic_dataset(
            repo,
            "main",
            SOURCES,
            seq_len=32,
            vocab_size=256,
            total_samples=1200,
            shards_per_source=SHARDS_PER_SOURCE,
        )
        manifest = json.loads(repo.get("main", "shards/manifest.json"))
        (entry,) = [e for e in manifest["shards"] if e["name"] == target]
        entry["sha256"] = "0" * 64
        repo.put("main", "shards/manifest.json", json.dumps(manifest).encode())
        commit = repo.commit("main", "a manifest with a wrong checksum").id
        Manifest.from_json(repo.get(commit, "shards/manifest.json"))  # still a valid manifest
        double.faults = FAULTS
        with pytest.raises(
            DataError, match=rf"shard {target} at commit {commit} has sha256 .* \(fetched twice\)"
        ):
            train(config("broken", tmp_path / "home", "lakefs://broken", commit))
        assert double.violations == []


@pytest.mark.slow
def test_training_streams_its_shards_from_a_real_lakefs_bit_exact(healthy, tmp_path):
    ds, reference_losses = healthy
    server = real_lakefs()
    name = f"stream-{uuid.uuid4().hex[:12]}"
    repo = server.connect(name)
    repo.ensure()
    try:
        with lakectl_environment(server):
            commit = publish_synthetic_dataset(
                repo,
                "main",
                SOURCES,
                seq_len=32,
                vocab_size=256,
                total_samples=1200,
                shards_per_source=SHARDS_PER_SOURCE,
            )
            run = config("over-real-lakefs", tmp_path / "home", f"lakefs://{name}", commit)
            train(run)
        assert [r["loss"] for r in train_records(run.run_dir())] == reference_losses  # bit for bit
        manifest = Manifest.from_json(repo.get(commit, "shards/manifest.json"))
        cache = ShardCache(run.cache_dir())
        cached = [e.name for e in manifest.shards if cache.path_for(e.sha256).exists()]
        assert cached, "the shards came through the node cache"
        entry = next(e for e in manifest.shards if e.name == cached[0])
        assert cache.path_for(entry.sha256).read_bytes() == repo.get(commit, entry.name)
    finally:
        repo._repo.delete()
