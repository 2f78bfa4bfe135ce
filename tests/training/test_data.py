"""The loader: sample order, world-size independence, resumable state, the verified shard cache."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from formats.shards import Manifest
from tests.training.helpers import make_dataset
from training.data import DataError, Loader, ShardCache, batch_positions, open_dataset
from versioning.local import LocalRepo


@pytest.fixture
def data(tmp_path):
    ds = make_dataset(tmp_path)
    repo = LocalRepo(ds.repo)
    _, dataset = open_dataset(
        repo, str(ds.repo), ds.commit, ShardCache(tmp_path / "cache"), 0.05, True, lambda: None
    )
    return dataset


def test_sample_order_is_a_pure_function_of_the_cursor_and_skips_held_out_and_skipped(data):
    skipped = [(40, 56)]
    cursor, batches = 0, []
    for _ in range(20):
        positions, cursor = batch_positions(data, cursor, 8, skipped)
        batches.append(positions)
    everything = np.concatenate(batches)
    assert np.all(np.diff(everything) > 0)  # increasing: no position twice
    assert not np.any((everything >= 40) & (everything < 56))
    source, _, index = data.plan.locate(everything)
    assert np.all(index < data.train_sequences[source])  # never a held-out sequence
    passed_over = np.setdiff1d(np.arange(everything[-1]), everything)
    src, _, idx = data.plan.locate(passed_over)
    outside_skip = (passed_over < 40) | (passed_over >= 56)
    assert np.all(idx[outside_skip] >= data.train_sequences[src[outside_skip]])  # only held-out passed over
    again, _ = batch_positions(data, int(batches[9][0]), 8, skipped)  # restart mid-way
    assert np.array_equal(again, batches[9])


def test_every_world_size_trains_on_the_same_samples_in_the_same_order(data):
    expected = None
    for world_size in (1, 2, 4):
        loaders = [Loader(data, 8, 2, rank, world_size, prefetch=2) for rank in range(world_size)]
        steps = [[loader.next_batch() for _ in range(5)] for loader in loaders]
        order = []
        for step in range(5):
            accumulation = 8 // (2 * world_size)
            per_rank = [steps[rank][step].tokens for rank in range(world_size)]  # [accumulation, 2, 33]
            order += [per_rank[rank][a] for a in range(accumulation) for rank in range(world_size)]
        tokens = np.concatenate([t.numpy() for t in order])
        expected = tokens if expected is None else expected
        assert np.array_equal(tokens, expected), world_size
        for loader in loaders:
            loader.close()
    first_batch, _ = batch_positions(data, 0, 8, [])
    source, _, index = data.plan.locate(first_batch)
    assert np.array_equal(expected[:8], data.rows(source, index))


def test_loader_state_resumes_at_the_next_batch_not_where_prefetching_got_to(data):
    loader = Loader(data, 8, 4, 0, 1, prefetch=4)
    for _ in range(3):
        loader.next_batch()
    state = loader.state_dict()
    following = [loader.next_batch() for _ in range(2)]
    loader.close()
    resumed = Loader(data, 8, 4, 0, 1, prefetch=4)
    resumed.load_state_dict(state)
    for before, after in zip(following, [resumed.next_batch() for _ in range(2)], strict=True):
        assert np.array_equal(before.positions, after.positions)
        assert np.array_equal(before.tokens.numpy(), after.tokens.numpy())
    resumed.close()


def test_wait_seconds_is_how_long_the_last_batch_waited_for_data(data, monkeypatch):
    """The data-wait figure behind the metrics' ``data_wait_share``, measured on a clock the test
    moves: reading the first batch takes five seconds of it, the second costs none."""
    import training.data as loader_module

    now = [100.0]
    consumer_timing = threading.Event()

    def perf_counter() -> float:
        value = now[0]
        consumer_timing.set()
        return value

    monkeypatch.setattr(loader_module, "time", SimpleNamespace(perf_counter=perf_counter))
    rows, first = data.rows, [True]

    def slow_first_rows(source, index):
        if first[0]:
            # Read the batch once next_batch() has started its stopwatch. The timeout only
            # breaks the deadlock of a loader that starts it after the data arrives (it then
            # fails the assertion below); it bounds nothing in a working one.
            consumer_timing.wait(timeout=120)
            now[0] += 5.0
            first[0] = False
        return rows(source, index)

    monkeypatch.setattr(data, "rows", slow_first_rows)
    loader = Loader(data, 8, 4, 0, 1, prefetch=2)
    try:
        loader.next_batch()
        assert loader.wait_seconds == 5.0, "the first batch waited while the producer read it"
        loader.next_batch()
        assert loader.wait_seconds == 0.0, "the second cost no time on the clock: the figure is per batch"
    finally:
        loader.close()


def test_running_past_the_mix_plan_is_a_clear_error(data):
    loader = Loader(data, 8, 8, 0, 1, prefetch=1)
    loader.load_state_dict({"cursor": data.plan.total_samples - 4, "skipped": []})
    with pytest.raises(DataError, match="mix plan holds"):
        loader.next_batch()


def test_a_corrupt_cached_shard_is_fetched_again(tmp_path):
    ds = make_dataset(tmp_path)
    repo = LocalRepo(ds.repo)
    entry = Manifest.from_json(repo.get(ds.commit, "shards/manifest.json")).shards[0]
    warnings = []
    cache = ShardCache(tmp_path / "cache", warn=warnings.append)
    path = cache.fetch(repo, ds.commit, entry)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert cache.fetch(repo, ds.commit, entry) == path
    assert "corrupt" in warnings[0]
    assert path.read_bytes() == repo.get(ds.commit, entry.name)


def test_a_commit_without_a_mix_plan_is_refused_clearly(tmp_path):
    ds = make_dataset(tmp_path)
    repo = LocalRepo(ds.repo)
    repo.delete("main", "mix.json")
    commit = repo.commit("main", "drop the mix").id
    with pytest.raises(DataError, match="no mix.json"):
        open_dataset(repo, str(ds.repo), commit, ShardCache(tmp_path / "cache"), 0.05, True, lambda: None)
