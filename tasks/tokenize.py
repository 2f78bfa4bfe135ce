"""The tokenizer of a dataset version: train a byte-level BPE, or reuse one; encode in parallel.

Training uses a seeded, order-independent sample of the deduplicated corpus: the documents
whose ``hash(seed, id)`` is smallest, up to a byte budget (bottom-k sampling), so the same
corpus and seed give the same sample however its parts are laid out. Nothing pretrained is
ever downloaded; :func:`train_tokenizer` starts from the 256 byte symbols.

The end-of-document token is always the first special token (id 0 when trained here).
Special tokens written inside a document are encoded as plain text
(``encode_special_tokens``), so the end-of-document id only ever appears where the shard
stage puts it.

Encoding is by tiktoken with the same ids (:mod:`tasks.tiktoken_bpe`, the default,
``ShardConfig.encoder = "tiktoken"``) or by ``tokenizers`` itself (``"tokenizers"``); a
document tiktoken might encode differently is re-encoded by ``tokenizers`` and counted
(``EncodedBatch.fallbacks``).

This module imports no Prefect and nothing heavy: encoding worker processes import it.
"""

from __future__ import annotations

import array
import hashlib
import heapq
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Literal, TypeVar

import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tasks.tiktoken_bpe import NotReproducible, TiktokenBPE, from_tokenizer_json

BYTE_ALPHABET_SIZE = 256
EncoderName = Literal["tiktoken", "tokenizers"]


class TokenizerError(ValueError):
    """A tokenizer that cannot serve this stage (missing, or without the end-of-document token)."""


def sample_key(seed: int, doc_id: str) -> int:
    """A uniform 64-bit key per (seed, document id): the sampling order."""
    return int.from_bytes(hashlib.blake2b(f"{seed}\0{doc_id}".encode(), digest_size=8).digest(), "little")


class TrainingSample:
    """Bottom-k sample by :func:`sample_key` under a byte budget, fed one Arrow table at a time.

    Keeps the documents with the smallest keys whose texts (each cut to ``max_doc_chars``)
    fit ``budget_bytes`` (at least one document); memory stays within the budget.
    """

    def __init__(self, budget_bytes: int, seed: int, max_doc_chars: int = 20_000):
        self.budget_bytes = budget_bytes
        self.seed = seed
        self.max_doc_chars = max_doc_chars
        self._heap: list[tuple[int, str]] = []  # (-key, text): the largest key on top
        self._bytes = 0
        self.documents_seen = 0

    def add(self, table: pa.Table) -> None:
        ids = table.column("id").to_pylist()
        texts = table.column("text").to_pylist()
        for doc_id, text in zip(ids, texts, strict=True):
            self.documents_seen += 1
            if not text:
                continue
            key = sample_key(self.seed, doc_id)
            if self._bytes >= self.budget_bytes and key >= -self._heap[0][0]:
                continue
            text = text[: self.max_doc_chars]
            heapq.heappush(self._heap, (-key, text))
            self._bytes += len(text.encode())
            while self._bytes > self.budget_bytes and len(self._heap) > 1:
                _, dropped = heapq.heappop(self._heap)
                self._bytes -= len(dropped.encode())

    def texts(self) -> list[str]:
        """The sample in key order (deterministic)."""
        return [text for _, text in sorted(self._heap, reverse=True)]

    @property
    def sample_bytes(self) -> int:
        return self._bytes


def train_tokenizer(texts: list[str], vocab_size: int, special_tokens: list[str]) -> Tokenizer:
    """A byte-level BPE trained from scratch; ``special_tokens[0]`` is the end-of-document token."""
    if not special_tokens:
        raise TokenizerError("special_tokens must start with the end-of-document token")
    if vocab_size < BYTE_ALPHABET_SIZE + len(special_tokens):
        raise TokenizerError(
            f"vocab_size {vocab_size} is below the {BYTE_ALPHABET_SIZE} byte symbols plus "
            f"{len(special_tokens)} special tokens; raise vocab_size"
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer, length=len(texts))
    tokenizer.encode_special_tokens = True
    return tokenizer


def load_tokenizer(tokenizer_json: str, eod_token: str) -> tuple[Tokenizer, int]:
    """The tokenizer and the id of ``eod_token``; raises TokenizerError naming the problem."""
    try:
        tokenizer = Tokenizer.from_str(tokenizer_json)
    except Exception as exc:  # the Rust side raises a bare Exception for malformed JSON
        raise TokenizerError(f"tokenizer JSON does not load: {exc}") from exc
    eod_id = tokenizer.token_to_id(eod_token)
    if eod_id is None:
        raise TokenizerError(
            f"the tokenizer has no end-of-document token {eod_token!r}; set eod_token to one it has"
        )
    # not serialised in tokenizer.json, so set on every load
    tokenizer.encode_special_tokens = True
    return tokenizer, eod_id


def tokenizer_sha256(tokenizer_json: str) -> str:
    return hashlib.sha256(tokenizer_json.encode()).hexdigest()


@dataclass
class EncodedBatch:
    """Token ids of a batch of documents: ``ids`` concatenated, ``lengths[i]`` tokens for document i;
    ``fallbacks``: documents tiktoken left to ``tokenizers`` (see :mod:`tasks.tiktoken_bpe`)."""

    ids: np.ndarray  # uint32
    lengths: np.ndarray  # int64
    fallbacks: int = 0


@dataclass(frozen=True)
class BatchEncoder:
    """``tokenizers``, and its tiktoken twin when that encoder is chosen and can give the same
    ids; ``unreproducible`` says why it cannot (then ``tokenizers`` encodes everything)."""

    tokenizer: Tokenizer
    bpe: TiktokenBPE | None
    unreproducible: str | None = None

    @classmethod
    def load(cls, tokenizer_json: str, encoder: EncoderName) -> BatchEncoder:
        tokenizer = Tokenizer.from_str(tokenizer_json)
        tokenizer.encode_special_tokens = True
        if encoder == "tokenizers":
            return cls(tokenizer, None)
        try:
            return cls(tokenizer, from_tokenizer_json(tokenizer_json))
        except NotReproducible as exc:
            return cls(tokenizer, None, str(exc))

    @property
    def name(self) -> EncoderName:
        return "tokenizers" if self.bpe is None else "tiktoken"

    def encode(self, texts: list[str]) -> EncodedBatch:
        if self.bpe is None:
            return _flatten([e.ids for e in self.tokenizer.encode_batch_fast(texts)])
        encoded, suspect = self.bpe.encode(texts)
        if suspect.size:
            redone = self.tokenizer.encode_batch_fast([texts[k] for k in suspect])
            for k, encoding in zip(suspect, redone, strict=True):
                encoded[k] = encoding.ids
        return _flatten(encoded, int(suspect.size))


def _flatten(encoded: list[list[int]], fallbacks: int = 0) -> EncodedBatch:
    flat = array.array("I")
    lengths = np.empty(len(encoded), np.int64)
    for i, ids in enumerate(encoded):
        lengths[i] = len(ids)
        flat.extend(ids)
    ids = np.frombuffer(flat, np.uint32) if flat else np.empty(0, np.uint32)
    return EncodedBatch(ids, lengths, fallbacks)


def encode_texts(tokenizer: Tokenizer, texts: list[str]) -> EncodedBatch:
    """``tokenizers``' own ids (the reference the tiktoken encoder is held to)."""
    return BatchEncoder(tokenizer, None).encode(texts)


_worker_encoder: BatchEncoder | None = None


def _start_worker(tokenizer_json: str, encoder: EncoderName) -> None:
    global _worker_encoder
    # one Rust thread per worker process: the processes are the parallelism
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker_encoder = BatchEncoder.load(tokenizer_json, encoder)


def _encode_in_worker(texts: list[str]) -> EncodedBatch:
    assert _worker_encoder is not None, "worker not started"
    return _worker_encoder.encode(texts)


Item = TypeVar("Item")


class Encoder:
    """Encodes batches of texts in order, in this process or in ``workers`` processes.

    ``workers == 1`` encodes here: tiktoken on one thread, or ``encode_batch_fast``
    (tokenizers' own Rust thread pool, governed by ``TOKENIZERS_PARALLELISM``/
    ``RAYON_NUM_THREADS``). ``workers > 1`` starts that many spawned processes, one thread
    each, with at most two batches in flight per worker, so memory stays bounded however
    long the input is.
    """

    def __init__(
        self, tokenizer_json: str, eod_token: str, workers: int = 1, encoder: EncoderName = "tiktoken"
    ):
        self.tokenizer, self.eod_id = load_tokenizer(tokenizer_json, eod_token)
        self.batch_encoder = BatchEncoder.load(tokenizer_json, encoder)
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        if workers > 1:
            self._pool = ProcessPoolExecutor(
                workers,
                mp_context=get_context("spawn"),
                initializer=_start_worker,
                initargs=(tokenizer_json, encoder),
            )

    def encode(self, texts: list[str]) -> EncodedBatch:
        return self.batch_encoder.encode(texts)

    def map(
        self, items: Iterable[Item], texts_of: Callable[[Item], list[str]]
    ) -> Iterator[tuple[Item, EncodedBatch]]:
        """``(item, encoding of texts_of(item))`` for each item, in input order."""
        if self._pool is None:
            for item in items:
                yield item, self.encode(texts_of(item))
            return
        in_flight: deque[tuple[Item, Future[EncodedBatch]]] = deque()
        for item in items:
            in_flight.append((item, self._pool.submit(_encode_in_worker, texts_of(item))))
            if len(in_flight) >= 2 * self.workers:
                done, future = in_flight.popleft()
                yield done, future.result()
        while in_flight:
            done, future = in_flight.popleft()
            yield done, future.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def __enter__(self) -> Encoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
