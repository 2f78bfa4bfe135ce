"""Tokenizer sampling, training, loading and parallel encoding (tasks/tokenize.py)."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from tasks.tokenize import Encoder, TokenizerError, TrainingSample, load_tokenizer, train_tokenizer

EOD = "<|endoftext|>"
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "def",
    "return",
    "import",
]


def corpus(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40))) for _ in range(n)]


def documents(texts: list[str]) -> pa.Table:
    return pa.table({"id": [f"doc-{i}" for i in range(len(texts))], "text": texts})


@pytest.fixture(scope="module")
def tokenizer_json() -> str:
    return train_tokenizer(corpus(300), vocab_size=320, special_tokens=[EOD, "<|pad|>"]).to_str()


def test_sample_is_the_same_whatever_the_part_layout() -> None:
    table = documents(corpus(400))
    whole = TrainingSample(budget_bytes=5_000, seed=7)
    whole.add(table)
    pieces = TrainingSample(budget_bytes=5_000, seed=7)
    for start in (300, 0, 150):  # other order, other chunking
        pieces.add(table.slice(start, 150 if start < 300 else 100))
    assert whole.texts() == pieces.texts()
    assert 0 < whole.sample_bytes <= 5_000 and whole.documents_seen == 400


def test_sample_depends_on_the_seed_and_skips_empty_texts() -> None:
    table = documents([*corpus(200), "", None])
    samples = []
    for seed in (1, 2):
        sample = TrainingSample(budget_bytes=2_000, seed=seed)
        sample.add(table)
        samples.append(sample.texts())
    assert samples[0] != samples[1]
    assert all(samples[0])


def test_a_document_larger_than_the_budget_still_gives_a_sample() -> None:
    sample = TrainingSample(budget_bytes=10, seed=0, max_doc_chars=50)
    sample.add(documents(["x" * 1_000]))
    assert sample.texts() == ["x" * 50]


def test_trained_tokenizer_round_trips_and_puts_eod_first(tokenizer_json: str) -> None:
    tokenizer, eod_id = load_tokenizer(tokenizer_json, EOD)
    assert eod_id == 0 and tokenizer.token_to_id("<|pad|>") == 1
    assert 256 + 2 < tokenizer.get_vocab_size() <= 320
    text = "gamma delta — ünïcode 🙂 def return"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text


def test_special_tokens_inside_text_are_encoded_as_text(tokenizer_json: str) -> None:
    tokenizer, eod_id = load_tokenizer(tokenizer_json, EOD)
    ids = tokenizer.encode(f"alpha {EOD} beta").ids
    assert eod_id not in ids
    assert tokenizer.decode(ids) == f"alpha {EOD} beta"


def test_training_is_deterministic() -> None:
    texts = corpus(200, seed=3)
    first = train_tokenizer(texts, 300, [EOD]).to_str()
    assert train_tokenizer(texts, 300, [EOD]).to_str() == first


def test_training_refuses_a_vocabulary_smaller_than_the_bytes() -> None:
    with pytest.raises(TokenizerError, match="raise vocab_size"):
        train_tokenizer(corpus(10), 200, [EOD])


def test_loading_names_a_missing_eod_token(tokenizer_json: str) -> None:
    with pytest.raises(TokenizerError, match="no end-of-document token '<eos>'"):
        load_tokenizer(tokenizer_json, "<eos>")
    with pytest.raises(TokenizerError, match="does not load"):
        load_tokenizer("{not json", EOD)


def test_worker_processes_encode_exactly_like_in_process(tokenizer_json: str) -> None:
    batches = [corpus(50, seed=s) for s in range(7)] + [["", "alpha"]]
    with Encoder(tokenizer_json, EOD, workers=1) as local:
        expected = [(b, e.ids.copy(), e.lengths.copy()) for b, e in local.map(batches, lambda b: b)]
    with Encoder(tokenizer_json, EOD, workers=2) as parallel:
        got = list(parallel.map(batches, lambda b: b))
    assert [b for b, _ in got] == batches  # input order kept
    for (_, ids, lengths), (_, encoded) in zip(expected, got, strict=True):
        np.testing.assert_array_equal(encoded.ids, ids)
        np.testing.assert_array_equal(encoded.lengths, lengths)
    assert expected[-1][2].tolist()[0] == 0  # an empty text has no tokens
