"""Streaming shards through the node's bounded, shared, verified cache (issue 19, item 1)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import numpy as np
import pytest

from formats.shards import Manifest
from tests.training.helpers import ROOT, make_config, make_dataset, train_records
from training.config import CheckpointConfig, DataConfig
from training.data import ShardCache, batch_positions, open_dataset, open_streaming
from training.metrics import read_metrics
from training.samples import read_binding
from training.streaming import BatchPlanner, ShardStream
from training.trainer import train
from versioning.local import LocalRepo

MANY_SOURCES = {"web": 600, "code": 400}
SHARDS_PER_SOURCE = 100  # 200 shards of 4-6 sequences: each step of 4 samples touches up to 4


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory):
    return make_dataset(
        tmp_path_factory.mktemp("many"), sources=MANY_SOURCES, shards_per_source=SHARDS_PER_SOURCE
    )


def small_steps(ds, run, home, steps=24, **data):
    """4 samples per step (2 micro-batches of 2), so one step needs at most 4 shards."""
    return make_config(
        ds, run, home=str(home), steps=steps, global_batch=4, micro_batch=2, eval_every=12,
        checkpoint=CheckpointConfig(every=8, keep_last=2),
        data=DataConfig(heldout_fraction=0.05, eval_sequences=8, prefetch_batches=2, **data),
    )  # fmt: skip


def shard_bytes(ds) -> list[int]:
    manifest = Manifest.from_json(LocalRepo(ds.repo).get(ds.commit, "shards/manifest.json"))
    return [e.bytes for e in manifest.shards]


def test_training_on_shards_ten_times_the_cache_cap_equals_the_fully_downloaded_run(many_shards, tmp_path):
    ds = many_shards
    # the fully downloaded run: every shard copied and verified before training starts
    full = small_steps(ds, "full", tmp_path / "full", loader="thread")
    open_dataset(
        LocalRepo(ds.repo), str(ds.repo), ds.commit, ShardCache(full.cache_dir()), 0.05, True, lambda: None
    )
    train(full)

    sizes = shard_bytes(ds)
    cap = sum(sizes) // 10
    streamed = small_steps(
        ds, "streamed", tmp_path / "streamed", cache_max_bytes=cap, cache_protect_steps=1, fetch_ahead_steps=2,
        shadow_prefetch_batches=1,
    )  # fmt: skip
    assert sum(sizes) >= 10 * cap
    train(streamed)

    full_losses = [r["loss"] for r in train_records(full.run_dir())]
    streamed_records = train_records(streamed.run_dir())
    assert [r["loss"] for r in streamed_records] == full_losses  # bit for bit
    data = [r for r in read_metrics(streamed.run_dir() / "metrics.jsonl") if r["kind"] == "data"][-1]
    cache = data["cache"]
    assert cache["peak_bytes"] <= cap and cache["over_cap_bytes"] == 0, cache
    assert cache["evicted"] > 0, "the cap never made the cache evict: the test would not test it"
    assert ShardCache(streamed.cache_dir()).usage() <= cap
    waits = [r["data_wait_ms"] for r in streamed_records]
    assert len(waits) == streamed.steps and data["longest_data_wait_ms"] == pytest.approx(max(waits))
    print(
        f"\nstreamed over a cap of {cap} bytes ({len(sizes)} shards, {sum(sizes)} bytes): fetched "
        f"{cache['fetched']} shards ({cache['fetched_bytes']} bytes), evicted {cache['evicted']}, peak "
        f"{cache['peak_bytes']} bytes; data wait total {sum(waits):.0f} ms, longest {max(waits):.1f} ms"
    )


class RecordingRepo(LocalRepo):
    """A local repository that remembers the order in which objects were opened."""

    def __init__(self, root):
        super().__init__(root)
        self.opened: list[str] = []
        self._guard = threading.Lock()

    def open(self, ref, path):
        with self._guard:
            self.opened.append(path)
        return super().open(ref, path)


def test_shards_are_fetched_in_the_order_the_sample_order_needs_them_not_file_order(many_shards, tmp_path):
    ds = many_shards
    recording = RecordingRepo(ds.repo)
    commit = open_streaming(
        LocalRepo(ds.repo), str(ds.repo), ds.commit, ShardCache(tmp_path / "cache"), 0.05, lambda: recording,
        workers=1,
    )  # fmt: skip
    dataset = commit.dataset
    planner = BatchPlanner(dataset, 4, 2, 1, [0], lookahead=3, stream=commit.stream)
    planner.reset(0, [])
    steps = 10
    for _ in range(steps):
        planner.next()
    commit.stream.close()

    expected, cursor = [], 0
    for _ in range(steps + 3):  # the lookahead reaches 3 steps past the last batch
        positions, cursor = batch_positions(dataset, cursor, 4, [])
        source, _, index = dataset.plan.locate(positions)
        for shard in sorted(set(dataset.shard_numbers(source, index).tolist())):
            if dataset.entries[shard].name not in expected:
                expected.append(dataset.entries[shard].name)
    fetched = [name for name in recording.opened if name.startswith("shards/")]
    assert fetched == expected[: len(fetched)] and len(fetched) >= len(set(expected[:20]))
    assert fetched != sorted(fetched), "the need order happened to be file order: the test shows nothing"
    assert len(fetched) < len(dataset.entries), "a run reading part of a commit fetches only that part"


def test_the_cap_evicts_the_shards_needed_furthest_ahead_and_never_those_of_the_next_steps(
    many_shards, tmp_path
):
    ds = many_shards
    repo = LocalRepo(ds.repo)
    _, manifest, _ = read_binding(repo, str(ds.repo), ds.commit)
    a, b, c, d, e = manifest.shards_of("web")[:5]  # equal sizes
    cache = ShardCache(tmp_path / "cache", max_bytes=3 * a.bytes, protect_steps=1, warn=lambda _: None)
    reader = cache.reader()
    reader.set_needs({a.sha256: 0, b.sha256: 1, c.sha256: 5})
    for entry, distance in ((a, 0), (b, 1), (c, 5)):
        assert cache.fetch(repo, ds.commit, entry, distance) is not None
    # d, needed in 6 steps, would only fit by evicting a shard needed sooner: not fetched yet
    reader.set_needs({a.sha256: 0, b.sha256: 1, c.sha256: 5, d.sha256: 6})
    assert cache.fetch(repo, ds.commit, d, 6) is None
    # e, needed in 2 steps: c (needed in 5) goes, a and b (inside the protected window) stay
    reader.set_needs({a.sha256: 0, b.sha256: 1, c.sha256: 5, e.sha256: 2})
    assert cache.fetch(repo, ds.commit, e, 2) is not None
    cached = {p.stem for p in (tmp_path / "cache").glob("??/*.bin")}
    assert cached == {a.sha256, b.sha256, e.sha256}
    # a shard nobody needs any more goes first
    reader.set_needs({b.sha256: 0, e.sha256: 1, d.sha256: 2})
    assert cache.fetch(repo, ds.commit, d, 2) is not None
    assert {p.stem for p in (tmp_path / "cache").glob("??/*.bin")} == {b.sha256, e.sha256, d.sha256}
    stats = cache.stats()
    assert stats["evicted"] == 2 and stats["peak_bytes"] <= 3 * a.bytes and stats["over_cap_bytes"] == 0
    reader.close()


FETCH_ALL = """
import json, random, sys
from pathlib import Path
from formats.shards import Manifest
from training.shard_cache import ShardCache
from versioning.local import LocalRepo
repo_path, commit, cache_dir, seed = sys.argv[1:5]
repo = LocalRepo(repo_path)
entries = Manifest.from_json(repo.get(commit, "shards/manifest.json")).shards[:40]
random.Random(int(seed)).shuffle(entries)
cache = ShardCache(Path(cache_dir))
print(json.dumps([str(cache.fetch(repo, commit, e)) for e in entries]))
"""


def test_processes_sharing_a_cache_fetch_each_shard_once(many_shards, tmp_path):
    ds = many_shards
    cache_dir = tmp_path / "cache"
    fetchers = [
        subprocess.Popen(
            [sys.executable, "-c", FETCH_ALL, str(ds.repo), ds.commit, str(cache_dir), str(seed)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for seed in range(4)
    ]
    outputs = [json.loads(p.communicate(timeout=300)[0]) for p in fetchers]
    assert all(p.returncode == 0 for p in fetchers)
    assert len({frozenset(o) for o in outputs}) == 1  # every process got the same 40 files
    stats = ShardCache(cache_dir).stats()
    assert stats["fetched"] == 40, f"{stats['fetched']} downloads for 40 shards"
    repo = LocalRepo(ds.repo)
    for entry in Manifest.from_json(repo.get(ds.commit, "shards/manifest.json")).shards[:40]:
        assert ShardCache(cache_dir).path_for(entry.sha256).read_bytes() == repo.get(ds.commit, entry.name)
    assert not list((cache_dir / ".tmp").iterdir())


def test_a_streamed_run_that_reads_part_of_a_commit_fetches_only_that_part(many_shards, tmp_path):
    ds = many_shards
    config = small_steps(ds, "part", tmp_path, steps=6)
    train(config)
    cached = len(list(config.cache_dir().glob("??/*.bin")))
    assert 0 < cached < len(shard_bytes(ds)) / 2
    assert np.isfinite([r["loss"] for r in train_records(config.run_dir())]).all()


class GatedCache(ShardCache):
    """Holds the first fetch of one shard until the test releases it."""

    def __init__(self, root, gated: str, **kwargs):
        super().__init__(root, **kwargs)
        self.gated, self.picked, self.release = gated, threading.Event(), threading.Event()
        self.calls: list[tuple[str, int, bool]] = []  # (shard, distance it was wanted at, fetched)

    def fetch(self, repo, commit, entry, distance=0):
        if entry.name == self.gated and not self.picked.is_set():
            self.picked.set()
            self.release.wait()
        path = super().fetch(repo, commit, entry, distance)
        self.calls.append((entry.name, distance, path is not None))
        return path


def test_a_shard_refused_for_room_while_the_needs_moved_on_is_fetched_when_needed(many_shards, tmp_path):
    """The race behind a hang: a shard wanted far ahead is refused for room while the reader
    has meanwhile come to need it next; it must be fetched again, not set aside until the
    needs change (they do not: the reader is waiting for that very shard)."""
    ds = many_shards
    repo = LocalRepo(ds.repo)
    commit = open_streaming(
        repo, str(ds.repo), ds.commit, ShardCache(tmp_path / "unused"), 0.05, lambda: repo, workers=1
    )
    dataset = commit.dataset
    commit.stream.close()
    a, b, x = 0, 1, 2
    sizes = [dataset.entries[s].bytes for s in (a, b)]
    cache = GatedCache(
        tmp_path / "cache",
        dataset.entries[x].name,
        max_bytes=sum(sizes),
        protect_steps=1,
        warn=lambda _: None,
    )
    stream = ShardStream(cache, lambda: repo, ds.commit, dataset, workers=1)
    try:
        stream.want({a: 0, b: 1, x: 2})
        cache.picked.wait()  # a and b are in; x, needed in 2 steps, does not fit beside them
        stream.want({x: 0, a: 1, b: 2})  # the reader moved on: x is needed next
        cache.release.set()  # the fetch picked under the old needs is refused for room
        rows = stream.array(x)  # a regression waits here forever (pytest-timeout ends it)
    finally:
        stream.close()
    assert rows.shape[0] > 0
    names = [dataset.entries[s].name for s in (a, b, x)]
    assert cache.calls[:3] == [(names[0], 0, True), (names[1], 1, True), (names[2], 2, False)]
    assert cache.calls[3:] == [(names[2], 0, True)]
