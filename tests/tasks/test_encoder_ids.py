"""The tiktoken encoder (tasks/tiktoken_bpe.py) gives tokenizers' ids: on generated text of every
kind, on every code point, and as shards byte for byte; where it cannot, it falls back and counts."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, processors

from formats import layout
from tasks.shard.config import ShardConfig
from tasks.tiktoken_bpe import NotReproducible, byte_symbols, from_tokenizer_json
from tasks.tokenize import BatchEncoder, Encoder, encode_texts, train_tokenizer
from tests.tasks.test_shard_stage import build_dedup_repo, shard_on_branch

EOD = "<|endoftext|>"
SPECIALS = [EOD, "<|pad|>", "[MASK]"]
EXAMPLES = int(os.environ.get("TOKENLAKE_FUZZ_EXAMPLES", "0")) or 150
PROFILE = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CODE = [
    "def ",
    "return ",
    "    ",
    "\t",
    "self.",
    "(",
    ")",
    "):\n",
    "==",
    " != ",
    "x_1",
    "__init__",
    "'s",
    "'ll",
    "'RE",
    "# comment",
    '"""',
    "{}",
    "[0]",
    "->",
    "0x1F",
    "3.14e-5",
    "\r\n",
    "ünïcödé",
    "naïve café",
    "日本語のテキスト",
    "Привет мир",
    "🙂👍🏽",
    "\u200b",
    "\u00a0",
    "١٢٣",
    "Ⅻ",
]
LOOK_ALIKES = [
    EOD,
    "<|endoftext|",
    "|endoftext|>",
    "<|endoftext|><|endoftext|>",
    "<<|pad|>>",
    "<|pad|>",
    "[MASK]",
    "[MASK",
    " <|endoftext|> ",
    "<|ENDOFTEXT|>",
    "<|endof text|>",
]


def training_corpus(seed: int) -> list[str]:
    """Prose-like and code-like lines mixing scripts, digits and the look-alikes, so the merges
    cover multi-byte characters, whitespace runs and pieces of special tokens."""
    rng = random.Random(seed)
    words = ["the", "of", "and", "token", "lake", "data", "shard", "über", "数据", "函数", "ça", "naïve"]
    lines = []
    for _ in range(1500):
        parts = [rng.choice(words + CODE + LOOK_ALIKES) for _ in range(rng.randint(1, 25))]
        lines.append(rng.choice(["", " ", "  "]).join(parts))
    return lines


def trained(vocab_size: int) -> tuple[str, BatchEncoder]:
    tokenizer_json = train_tokenizer(training_corpus(vocab_size), vocab_size, SPECIALS).to_str()
    return tokenizer_json, BatchEncoder.load(tokenizer_json, "tiktoken")


@pytest.fixture(scope="module", params=[300, 1200, 4096], ids=lambda v: f"vocab{v}")
def pair(request) -> tuple[str, BatchEncoder]:
    return trained(request.param)


def assert_same_ids(encoder: BatchEncoder, texts: list[str]) -> None:
    expected = encode_texts(encoder.tokenizer, texts)
    got = encoder.encode(texts)
    np.testing.assert_array_equal(got.lengths, expected.lengths)
    np.testing.assert_array_equal(got.ids, expected.ids)
    assert got.fallbacks == 0  # a tokenizer trained here has no unreachable token


whitespace = st.text(alphabet=" \t\n\r\x0b\x0c\u00a0\u2003\u3000\u2028\x85", min_size=1, max_size=40)
long_word = st.builds(
    lambda letters, n: (letters * n)[: n * 3],
    st.text(alphabet="abcxyzé日", min_size=1, max_size=3),
    st.integers(50, 3000),
)
piece = st.one_of(
    st.text(max_size=30),  # any code point but surrogates
    st.sampled_from(CODE),
    st.sampled_from(LOOK_ALIKES),
    whitespace,
    long_word,
    st.integers(-(10**12), 10**12).map(str),
)
document = st.lists(piece, max_size=12).map("".join)


@settings(PROFILE)
@given(texts=st.lists(document, min_size=1, max_size=6))
def test_tiktoken_gives_the_ids_of_tokenizers(pair, texts):
    assert_same_ids(pair[1], texts)


def test_the_reference_corpus_and_look_alikes_encode_alike(pair):
    texts = training_corpus(99) + LOOK_ALIKES + ["", " ", "\n\n\n", "a" * 20_000, " " * 5000 + "x"]
    assert_same_ids(pair[1], texts)
    assert 0 not in pair[1].encode(LOOK_ALIKES).ids  # special-token text is plain text


@pytest.mark.slow
def test_every_code_point_in_every_pre_tokenizer_context_encodes_alike():
    """Each of the 1,112,064 scalar values after a letter, a digit, punctuation, a tab, a space
    and itself: where the two regex engines' Unicode classes differed, the pieces would (one
    vocabulary is enough: the classes are the pre-tokenizer's)."""
    points = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    texts = [
        "".join(f"x{c}x1{c}1!{c}!\t{c} {c}{c}\n" for c in map(chr, points[start : start + 4096]))
        for start in range(0, len(points), 4096)
    ]
    assert_same_ids(trained(4096)[1], texts)


def with_unreachable_token(tokenizer_json: str, word: str) -> str:
    """The tokenizer with ``word`` added to the vocabulary but to no merge: tokenizers never
    produces it, tiktoken would for a piece of exactly those bytes."""
    spec = json.loads(tokenizer_json)
    to_symbol = {b: s for s, b in byte_symbols().items()}
    vocab = spec["model"]["vocab"]
    vocab["".join(to_symbol[b] for b in word.encode())] = max(vocab.values()) + 1
    return json.dumps(spec)


def test_a_document_tiktoken_might_get_wrong_falls_back_and_is_counted(pair):
    tokenizer_json = with_unreachable_token(pair[0], " zqzqzq")
    encoder = BatchEncoder.load(tokenizer_json, "tiktoken")
    texts = ["plain text", "has zqzqzq inside", "zqzqzqzq and zqzqzq", "the data"]
    assert encoder.bpe is not None
    assert encoder.bpe.encoding.encode_ordinary(texts[1]) != encoder.tokenizer.encode(texts[1]).ids
    expected = encode_texts(encoder.tokenizer, texts)
    got = encoder.encode(texts)
    np.testing.assert_array_equal(got.ids, expected.ids)
    np.testing.assert_array_equal(got.lengths, expected.lengths)
    assert got.fallbacks == 2


def test_a_tokenizer_tiktoken_cannot_reproduce_is_encoded_by_tokenizers_and_says_why(pair):
    texts = training_corpus(5)[:50]
    spec = json.loads(pair[0])
    spec["normalizer"] = {"type": "Lowercase"}
    lowercased = BatchEncoder.load(json.dumps(spec), "tiktoken")
    assert (lowercased.name, lowercased.unreproducible) == ("tokenizers", "the tokenizer has a normalizer")
    assert lowercased.encode(texts).ids.tolist() == encode_texts(lowercased.tokenizer, texts).ids.tolist()
    tokenizer = Tokenizer.from_str(pair[0])
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{EOD} $A", special_tokens=[(EOD, 0)])
    with_bos = BatchEncoder.load(tokenizer.to_str(), "tiktoken")
    assert with_bos.unreproducible == "the post-processor 'TemplateProcessing' adds or changes ids"
    assert with_bos.encode(texts[:3]).ids.tolist() == encode_texts(with_bos.tokenizer, texts[:3]).ids.tolist()
    spec = json.loads(pair[0])
    spec["model"]["merges"] = spec["model"]["merges"][::-1]
    with pytest.raises(NotReproducible, match="merges do not create tokens in the order of their ids"):
        from_tokenizer_json(json.dumps(spec))
    tokenizer = Tokenizer.from_str(pair[0])
    tokenizer.add_tokens(["<|unused|>"])
    with pytest.raises(NotReproducible, match="not special"):
        from_tokenizer_json(tokenizer.to_str())
    assert from_tokenizer_json(pair[0]).suspect.sum() == 0


def test_worker_processes_give_the_same_ids_with_either_encoder(pair):
    batches = [training_corpus(s)[:40] for s in range(4)]
    results = []
    for encoder, workers in (("tokenizers", 1), ("tiktoken", 1), ("tiktoken", 2)):
        with Encoder(pair[0], EOD, workers=workers, encoder=encoder) as running:
            results.append([e.ids.tolist() for _, e in running.map(batches, lambda b: b)])
    assert results[0] == results[1] == results[2]


def test_shards_are_byte_identical_with_either_encoder(tmp_path):
    repo, input_commit = build_dedup_repo(tmp_path / "repo")
    config = ShardConfig(vocab_size=400, seq_len=31, max_sequences_per_shard=40, batch_documents=64)
    results = {
        encoder: shard_on_branch(
            repo, input_commit, f"curate-{encoder}", config.model_copy(update={"encoder": encoder})
        )
        for encoder in ("tokenizers", "tiktoken")
    }
    shards = {
        encoder: {
            o.path: repo.get(result.commit_id, o.path)
            for o in repo.list(result.commit_id, layout.SHARDS + "/")
        }
        for encoder, result in results.items()
    }
    assert shards["tiktoken"] == shards["tokenizers"] and len(shards["tiktoken"]) > 2
    assert results["tiktoken"].report["extra"]["encoder_fallbacks"] == 0
    assert results["tiktoken"].report["extra"]["encoder_used"] == ["tiktoken"]
    assert results["tokenizers"].report["extra"]["encoder_used"] == ["tokenizers"]
    repo.close()
