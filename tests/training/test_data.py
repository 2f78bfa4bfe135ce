"""The loader: sample order, world-size independence, resumable state, the verified shard cache."""

from __future__ import annotations

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
    assert resumed.wait_seconds >= 0.0
    resumed.close()


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
