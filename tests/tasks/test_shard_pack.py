"""Pure packing logic of the shard stage: weights, EOD insertion, rows, balanced shards, pack_source."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from formats.shards import read_shard
from tasks.shard.config import ShardConfig
from tasks.shard.pack import (
    INVALID_WEIGHT,
    Packer,
    RowSpill,
    balanced_sizes,
    pack_source,
    repeat_counts,
    with_eod,
)
from tasks.tokenize import Encoder, train_tokenizer

EOD = "<|endoftext|>"
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "this",
    "are",
    "or",
    "from",
    "at",
    "which",
]


def docs(texts: list[str | None], weights: list[float | None] | None = None, prefix: str = "d") -> pa.Table:
    columns = {"id": [f"{prefix}{i}" for i in range(len(texts))], "text": pa.array(texts, pa.string())}
    if weights is not None:
        columns["weight"] = pa.array(weights, pa.float64())
    return pa.table(columns)


def test_repeat_counts_honour_whole_weights_and_flag_invalid_ones() -> None:
    table = docs(["x"] * 7, [1.0, 0.0, 2.0, 3.0, float("nan"), -0.5, None])
    counts = repeat_counts(table, seed=0, max_repeats=4)
    assert counts.tolist() == [1, 0, 2, 3, INVALID_WEIGHT, INVALID_WEIGHT, INVALID_WEIGHT]
    assert repeat_counts(docs(["x"]), seed=0, max_repeats=4).tolist() == [1]  # no weight column
    assert repeat_counts(docs(["x"], [9.0]), seed=0, max_repeats=4).tolist() == [4]  # clamped


def test_fractional_weights_keep_the_expected_token_mass() -> None:
    n, weight = 20_000, 0.25
    table = docs(["x"] * n, [weight] * n)
    counts = repeat_counts(table, seed=1, max_repeats=4)
    sd = math.sqrt(n * weight * (1 - weight))
    assert abs(counts.sum() - n * weight) < 4 * sd
    assert np.array_equal(counts, repeat_counts(table, seed=1, max_repeats=4))  # deterministic
    assert not np.array_equal(counts, repeat_counts(table, seed=2, max_repeats=4))
    upsampled = repeat_counts(docs(["x"] * n, [1.5] * n), seed=1, max_repeats=4)
    assert set(upsampled.tolist()) == {1, 2}
    assert abs(upsampled.sum() - 1.5 * n) < 4 * math.sqrt(n * 0.25)


def test_with_eod_appends_one_eod_per_document() -> None:
    ids = np.array([5, 6, 7, 8, 9], np.uint32)
    stream = with_eod(ids, np.array([2, 3]), eod=0, dtype=np.dtype("uint16"))
    assert stream.tolist() == [5, 6, 0, 7, 8, 9, 0] and stream.dtype == np.uint16


def test_packer_cuts_rows_across_calls_and_keeps_the_remainder() -> None:
    packer = Packer(row_len=4, dtype=np.dtype("uint16"))
    assert packer.add(np.arange(3, dtype=np.uint16)).shape == (0, 4)
    rows = packer.add(np.arange(3, 13, dtype=np.uint16))
    assert rows.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert packer.remainder == 1


@pytest.mark.parametrize(
    ("sequences", "limit"), [(0, 5), (1, 5), (10, 5), (11, 5), (1000, 7), (12_345, 4096)]
)
def test_balanced_sizes_differ_by_at_most_one(sequences: int, limit: int) -> None:
    sizes = balanced_sizes(sequences, limit)
    assert sum(sizes) == sequences
    assert not sizes or (max(sizes) - min(sizes) <= 1 and max(sizes) <= limit)
    assert len(sizes) == math.ceil(sequences / limit)


def test_spill_writes_balanced_shards_with_the_same_rows(tmp_path) -> None:
    rows = np.arange(11 * 5, dtype=np.uint16).reshape(11, 5) % 50 + 1
    rows[3, 2] = 0
    spill = RowSpill(tmp_path / "web.rows", row_len=5, dtype=np.dtype("uint16"))
    spill.append(rows[:4])
    spill.append(rows[4:])
    written = spill.write_shards(tmp_path, eod=0, max_per_shard=4, block_rows=2)
    assert [w.sequences for w in written] == [4, 4, 3]
    assert [w.documents for w in written] == [1, 0, 0]
    assert not (tmp_path / "web.rows").exists()
    np.testing.assert_array_equal(np.concatenate([read_shard(w.path)[1] for w in written]), rows)


@pytest.fixture(scope="module")
def encoder():
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(30)) for _ in range(200)]
    with Encoder(train_tokenizer(texts, 300, [EOD]).to_str(), EOD) as enc:
        yield enc


def run_pack(tmp_path, encoder, tables: list[pa.Table], **config):
    cfg = ShardConfig(seq_len=7, batch_documents=3, **config)
    spill = RowSpill(tmp_path / "s.rows", cfg.seq_len + 1, np.dtype("uint16"))
    quarantined: list[pa.Table] = []
    passes: list[int] = []

    def read_tables(pass_number: int):
        passes.append(pass_number)
        return iter(tables)

    outcome = pack_source("web", read_tables, encoder, cfg, spill, quarantined.append)
    written = spill.write_shards(tmp_path, encoder.eod_id, cfg.max_sequences_per_shard)
    stream = np.concatenate([read_shard(w.path)[1].ravel() for w in written]) if written else np.empty(0)
    return outcome, stream, quarantined, passes


def expected_stream(encoder, texts: list[str]) -> list[int]:
    return [t for text in texts for t in [*encoder.tokenizer.encode(text).ids, encoder.eod_id]]


def test_packed_rows_are_the_documents_token_stream_in_order(tmp_path, encoder) -> None:
    texts = [f"the {' and'.join(WORDS[: i + 1])} of {i}" for i in range(20)]
    outcome, stream, quarantined, passes = run_pack(
        tmp_path, encoder, [docs(texts[:9]), docs(texts[9:], prefix="e")]
    )
    full = expected_stream(encoder, texts)
    assert stream.tolist() == full[: len(stream)]
    assert len(full) - len(stream) == outcome.tail_tokens_dropped < 8
    assert (outcome.documents_in, outcome.kept, outcome.rejected, passes) == (20, 20, {}, [1])
    assert quarantined == []


def test_empty_texts_and_invalid_weights_are_quarantined_with_a_reason(tmp_path, encoder) -> None:
    table = docs(["the of and", "", None, "to in a is", "that for"], [1.0, 1.0, 1.0, float("nan"), 0.0])
    outcome, stream, quarantined, _ = run_pack(tmp_path, encoder, [table])
    assert outcome.rejected == {"no_tokens": 2, "invalid_weight": 1, "sampled_out_by_weight": 1}
    assert outcome.documents_in == outcome.kept + sum(outcome.rejected.values())
    reasons = pa.concat_tables(quarantined).to_pydict()
    assert sorted(zip(reasons["id"], reasons["reason"], strict=True)) == [
        ("d1", "no_tokens"),
        ("d2", "no_tokens"),
        ("d3", "invalid_weight"),
    ]
    assert set(reasons["stage"]) == {"shard"}
    assert outcome.sequences == 0 and "fewer than one sequence of 8" in outcome.reason


def test_repeated_documents_come_in_a_later_pass(tmp_path, encoder) -> None:
    texts = ["the of and to in a is that", "for it as was with", "be by on not this"]
    outcome, stream, _, passes = run_pack(tmp_path, encoder, [docs(texts, [1.0, 2.0, 1.0])])
    assert passes == [1, 2] and outcome.repeated_copies == 1
    full = expected_stream(encoder, [*texts, texts[1]])
    assert stream.tolist() == full[: len(stream)]


def test_a_source_of_only_sampled_out_documents_says_so(tmp_path, encoder) -> None:
    outcome, stream, _, _ = run_pack(tmp_path, encoder, [docs(["the of"] * 3, [0.0] * 3)])
    assert (
        stream.size == 0
        and outcome.reason == "all 3 documents were rejected or sampled out (3 sampled_out_by_weight)"
    )
    outcome, _, _, _ = run_pack(tmp_path, encoder, [])
    assert outcome.reason == "no documents"


def streaming_peak(workdir: Path, tables_count: int) -> dict[str, int]:
    """Pack ``tables_count`` generated tables of one source; the traced peak and the bytes spilled.

    Runs in a fresh interpreter (see the test below), so the peak holds only this process's
    packing, not what other threads of a test session allocate meanwhile."""
    import tracemalloc

    rng = random.Random(4)
    letters = "abcdefghijklmnopqrstuvwxyz    "

    def tables(count: int):
        for t in range(count):  # generated lazily, one table at a time, as parts are read
            yield docs(["".join(rng.choices(letters, k=400)) for _ in range(40)], prefix=f"t{t}-")

    cfg = ShardConfig(seq_len=127, batch_documents=16)
    words = random.Random(0)
    texts = [" ".join(words.choice(WORDS) for _ in range(30)) for _ in range(200)]
    with Encoder(train_tokenizer(texts, 300, [EOD]).to_str(), EOD) as encoder:

        def pack(name: str, count: int):
            spill = RowSpill(workdir / f"{name}.rows", cfg.seq_len + 1, np.dtype("uint16"))
            outcome = pack_source(name, lambda _: tables(count), encoder, cfg, spill, lambda table: None)
            spill.discard()
            return outcome, spill.rows * (cfg.seq_len + 1) * 2

        pack("warm-up", 1)  # lazy imports (pyarrow pulls in pandas) are not the stream's memory
        tracemalloc.start()
        try:
            outcome, spilled = pack("big", tables_count)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    return {"kept": outcome.kept, "spilled": spilled, "peak": peak}


def test_memory_stays_bounded_while_a_source_streams_through(tmp_path, repo_root) -> None:
    code = (
        "import json, sys; from pathlib import Path; "
        "from tests.tasks.test_shard_pack import streaming_peak; "
        "print(json.dumps(streaming_peak(Path(sys.argv[1]), 30)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=repo_root, capture_output=True, text=True, check=True
    )
    measured = json.loads(result.stdout.splitlines()[-1])
    peak, spilled = measured["peak"], measured["spilled"]
    assert measured["kept"] == 1200 and spilled > 500_000
    assert peak < spilled / 4, f"peak {peak} bytes for {spilled} bytes of tokens"
