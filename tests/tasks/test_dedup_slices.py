"""How a bucket step of the dedup shuffle holds less than its bucket (tasks/dedup/shuffle/scratch.py):
its inputs read back in slices that keep equal keys together, its outputs written across many
calls to one bundle per producer, which each receiver reads its slice of."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pytest

from tasks.dedup import DedupConfig
from tasks.dedup.index import content_buckets
from tasks.dedup.plan import keys_to_arrow
from tasks.dedup.shuffle.scratch import (
    KEY,
    BucketWriter,
    ShuffleRun,
    SlicedInput,
    band_schema,
    slice_of_band_key,
    slice_of_content,
)
from versioning.local import LocalRepo

ROWS = pa.schema([("content_key", KEY), ("value", pa.int64())])


def keys(n: int, seed: int = 0) -> list[bytes]:
    return [hashlib.sha256(f"{seed}-{i}".encode()).digest()[:16] for i in range(n)]


@pytest.fixture
def run(tmp_path):
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    commit = repo.resolve("main")
    yield lambda slice_bytes: ShuffleRun(
        repo,
        "main",
        commit,
        DedupConfig(buckets=4, slice_bytes=slice_bytes),
        "_scratch/dedup",
        "index/run",
        (),
    )
    repo.close()


def test_slices_keep_equal_keys_together_and_every_row_once(run):
    shuffle = run(1 << 10)
    rng = np.random.default_rng(0)
    distinct = keys(300)
    # three producers' files for bucket 0, each key repeated across them
    for producer in range(3):
        chosen = [distinct[i] for i in rng.integers(0, len(distinct), 400)]
        table = pa.table(
            {"content_key": pa.array(chosen, KEY), "value": pa.array(np.arange(400) + 1000 * producer)}
        )
        shuffle.put(shuffle.at("rows", 0, f"p{producer}"), table)
    whole = shuffle.read(shuffle.at("rows", 0), ROWS)

    seen: dict[bytes, int] = {}
    pieces = []
    for s, slices, (table,) in shuffle.in_slices(
        [SlicedInput(shuffle.at("rows", 0), ROWS, slice_of_content("content_key"))]
    ):
        assert slices > 4  # ~20 KB of files against 1 KiB slices
        for key in table.column("content_key").to_pylist():
            assert seen.setdefault(key, s) == s, "a key appeared in two slices"
        pieces.append(table)
    together = pa.concat_tables(pieces)
    assert sorted(together.column("value").to_pylist()) == sorted(whole.column("value").to_pylist())


def test_a_bucket_that_fits_is_read_whole_in_one_slice(run):
    shuffle = run(16 << 20)
    table = pa.table({"content_key": pa.array(keys(50), KEY), "value": pa.array(np.arange(50))})
    shuffle.put(shuffle.at("rows", 1, "p0"), table)
    got = list(shuffle.in_slices([SlicedInput(shuffle.at("rows", 1), ROWS, slice_of_content("content_key"))]))
    assert [(s, n) for s, n, _ in got] == [(0, 1)]
    assert got[0][2][0].equals(table)


def test_slice_functions_do_not_depend_on_the_bucket_bits():
    """A bucket's keys share their bucket bits; the slice must still spread them."""
    content = np.array(keys(4000), "S16")
    bucket = content_buckets(content, 4)
    mine = content[bucket == 2]
    table = pa.table({"content_key": keys_to_arrow(mine)})
    counts = np.bincount(slice_of_content("content_key")(table, 8), minlength=8)
    assert counts.min() > len(mine) / 8 * 0.6

    band_key = np.arange(0, 40_000, 5, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    in_bucket = band_key[band_key % np.uint64(5) == 0]
    records = pa.table(
        {
            "band": pa.array(np.zeros(len(in_bucket), np.int32)),
            "key": pa.array(in_bucket),
            "content_key": pa.array([b"0" * 16] * len(in_bucket), KEY),
        },
        schema=band_schema(),
    )
    counts = np.bincount(slice_of_band_key(5)(records, 7), minlength=7)
    assert counts.min() > len(in_bucket) / 7 * 0.6


def test_a_bucket_writer_writes_one_bundle_across_writes_and_spills(run):
    shuffle = run(1 << 10)  # every write past 1 KiB goes to the local spill files
    written = []
    with BucketWriter(shuffle, "out", "b00001") as writer:
        for call in range(5):
            table = pa.table(
                {"content_key": pa.array(keys(40, call), KEY), "value": pa.array(np.arange(40) + 100 * call)}
            )
            writer.write(table, np.arange(40) % 3)
            written.append(table)
        assert writer._spilled, "the writes past slice_bytes were meant to go to the spill files"
    objects = [o.path for o in shuffle.repo.list("main", f"{shuffle.scratch}/out/")]
    assert objects == [shuffle.bundle_path("out", "b00001", 3)]
    everything = pa.concat_tables(written)
    for b in range(4):
        got = shuffle.read(shuffle.at("out", b), ROWS)
        expected = everything.filter(pa.array(np.tile(np.arange(40) % 3, 5) == b))
        assert got.column("value").to_pylist() == expected.column("value").to_pylist()  # write order kept


def test_receivers_read_their_slice_of_every_producers_bundle_and_files_beside_them(run):
    """Five producers scatter to 7 receivers (some get nothing from some producers), a file is
    put beside the bundles: each receiver reads exactly its rows, whole or in slices, and the
    step wrote one object per producer."""
    rng = np.random.default_rng(4)
    for slice_bytes in (16 << 20, 1 << 10):
        shuffle = run(slice_bytes)
        step = f"scatter-{slice_bytes}"
        sent: dict[int, list[int]] = {b: [] for b in range(7)}
        for producer in range(5):
            n = int(rng.integers(0, 200))
            receiver = rng.integers(0, 7 - producer, n)  # later producers reach fewer receivers
            values = np.arange(n) + 1000 * producer
            table = pa.table({"content_key": pa.array(keys(n, producer), KEY), "value": pa.array(values)})
            shuffle.scatter(step, table, receiver, f"p{producer:06d}")
            for b, v in zip(receiver, values, strict=True):
                sent[int(b)].append(int(v))
        shuffle.put(
            shuffle.at(step, 2, "file"),
            pa.table({"content_key": pa.array(keys(3, 9), KEY), "value": [-1, -2, -3]}),
        )
        sent[2] = [-1, -2, -3] + sent[2]  # files first, then bundles in producer order
        objects = list(shuffle.repo.list("main", f"{shuffle.scratch}/{step}/"))
        assert len(objects) == 1 + sum(1 for o in objects if o.path.endswith(".bundle")) <= 6
        for b in range(7):
            assert shuffle.read(shuffle.at(step, b), ROWS).column("value").to_pylist() == sent[b]
            sliced = [
                v
                for _, _, (table,) in shuffle.in_slices(
                    [SlicedInput(shuffle.at(step, b), ROWS, slice_of_content("content_key"))]
                )
                for v in table.column("value").to_pylist()
            ]
            assert sorted(sliced) == sorted(sent[b])


def test_a_bucket_writer_puts_nothing_when_its_step_fails(run):
    shuffle = run(1 << 10)
    with pytest.raises(RuntimeError), BucketWriter(shuffle, "out", "b00002") as writer:
        writer.write(
            pa.table({"content_key": pa.array(keys(40), KEY), "value": pa.array(np.arange(40))}),
            np.zeros(40, np.int64),
        )
        raise RuntimeError("the step failed")
    assert list(shuffle.repo.list("main", f"{shuffle.scratch}/out/")) == []
