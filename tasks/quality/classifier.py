"""Classifier-based quality scoring, trained the way GPT-3's filter was (Brown et al. 2020,
appendix A): documents of the sources marked ``reference`` are positives, a sample of the rest
of the raw corpus negatives, and a linear model over hashed word n-grams separates them.
Its score (0: unlike the reference, 1: like it) is a column; a threshold or GPT-3's Pareto
sampling turns it into a keep rule.

A scorer is anything with the :class:`QualityScorer` methods, built by a factory named in
``ClassifierConfig.factory`` as ``"module:attribute"`` and called as
``factory(positives, negatives, config) -> QualityScorer``. The default trains
:class:`HashedLinearScorer`; a factory may ignore the samples and load its own model.
"""

from __future__ import annotations

import importlib
import io
import zlib
from collections.abc import Callable
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field

from tasks.quality.segments import mix64, ratio, split_words


@runtime_checkable
class QualityScorer(Protocol):
    def score(self, texts: pa.Array) -> np.ndarray:
        """One score in [0, 1] per text: how much it resembles the reference documents."""

    def describe(self) -> dict[str, Any]:
        """JSON-able facts for the stage report (model, training size, held-out accuracy...)."""

    def to_bytes(self) -> bytes | None:
        """The model, saved next to the report; None if there is nothing to save."""


ScorerFactory = Callable[[pa.Array, pa.Array, "ClassifierConfig"], QualityScorer]


class ClassifierConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="Active when at least one source is marked reference.")
    kinds: list[Literal["prose", "code"]] = Field(default_factory=lambda: ["prose"])
    factory: str = "tasks.quality.classifier:train_hashed_linear"
    keep: Literal["off", "threshold", "pareto"] = Field(
        default="off",
        description="off: score only; threshold: keep score >= threshold; "
        "pareto: keep if a Pareto(alpha) draw seeded by the document id exceeds 1 - score (GPT-3).",
    )
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    pareto_alpha: float = Field(default=9.0, gt=0.0)
    filter_reference: bool = Field(
        default=False, description="Also apply the keep rule to reference sources."
    )
    max_training_docs: int = Field(default=5_000, ge=2, description="Per class.")
    hash_bits: int = Field(default=18, ge=8, le=26)
    max_words: int = Field(default=512, ge=1, description="Leading words of a document that become features.")
    epochs: int = Field(default=8, ge=1)
    learning_rate: float = Field(default=0.5, gt=0.0)
    l2: float = Field(default=1e-6, ge=0.0)
    holdout_fraction: float = Field(default=0.1, ge=0.0, lt=1.0)
    seed: int = 0


def load_factory(spec: str) -> ScorerFactory:
    """The callable named ``module:attribute``; a ValueError naming the spec if it cannot be loaded."""
    module_name, _, attribute = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(
            f"classifier.factory {spec!r} cannot be loaded ({exc}); use 'module:callable'"
        ) from exc
    if not callable(target):
        raise ValueError(f"classifier.factory {spec!r} is not callable")
    return target


def _word_hashes(distinct_words: pa.Array) -> pa.Array:
    # crc32 is stable across processes (Python's hash() is salted), so a saved model stays valid
    return pa.array([zlib.crc32(w.encode()) for w in distinct_words.to_pylist()], pa.uint64())


def hashed_features(
    texts: pa.Array, hash_bits: int, max_words: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR rows ``(indptr, feature, value)``: lowercased word unigrams and bigrams of each
    text's first ``max_words`` words, hashed to ``2**hash_bits`` buckets, log(1 + count)
    values scaled to unit length per document."""
    words = split_words(pc.utf8_lower(pc.fill_null(texts, "")))
    starts = np.concatenate([[0], np.cumsum(words.counts)])
    position = np.arange(len(words.doc)) - starts[words.doc]
    hashes = words.per_distinct(_word_hashes).astype(np.uint64)
    leading = position < max_words
    bigram = leading & (position + 1 < np.minimum(words.counts[words.doc], max_words))
    bigram_at = np.flatnonzero(bigram)
    mask = np.uint64((1 << hash_bits) - 1)
    features = np.concatenate(
        [
            mix64(hashes[leading]) & mask,
            mix64(hashes[bigram_at] * np.uint64(0x100000001B3) + hashes[bigram_at + 1] + np.uint64(1)) & mask,
        ]
    ).astype(np.int64)
    docs = np.concatenate([words.doc[leading], words.doc[bigram_at]])
    keys, counts = np.unique((docs << hash_bits) | features, return_counts=True)
    doc, feature = keys >> hash_bits, keys & int(mask)
    value = np.log1p(counts.astype(np.float64))
    norm = np.sqrt(np.bincount(doc, weights=value * value, minlength=len(texts)))
    value /= norm[doc]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(doc, minlength=len(texts)))])
    return indptr, feature, value


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _auc(scores: np.ndarray, labels: np.ndarray) -> float:
    positives, negatives = labels.sum(), (1 - labels).sum()
    if positives == 0 or negatives == 0:
        return float("nan")
    ranks = np.empty(len(scores))
    ranks[np.argsort(scores, kind="stable")] = np.arange(1, len(scores) + 1)
    return float((ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


class HashedLinearScorer:
    """Logistic regression over hashed word uni- and bigrams (the GPT-3 recipe: Spark's
    HashingTF features and a logistic regression), trained with mini-batch AdaGrad."""

    def __init__(
        self, weights: np.ndarray, bias: float, hash_bits: int, max_words: int, facts: dict[str, Any]
    ):
        self.weights = weights
        self.bias = bias
        self.hash_bits = hash_bits
        self.max_words = max_words
        self.facts = facts

    def _margins(self, indptr: np.ndarray, feature: np.ndarray, value: np.ndarray) -> np.ndarray:
        doc = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
        return np.bincount(doc, weights=self.weights[feature] * value, minlength=len(indptr) - 1) + self.bias

    def score(self, texts: pa.Array) -> np.ndarray:
        return _sigmoid(self._margins(*hashed_features(texts, self.hash_bits, self.max_words)))

    def describe(self) -> dict[str, Any]:
        return {
            "model": "hashed_linear",
            "hash_bits": self.hash_bits,
            "max_words": self.max_words,
            **self.facts,
        }

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        np.savez_compressed(
            buffer,
            weights=self.weights.astype(np.float32),
            bias=self.bias,
            hash_bits=self.hash_bits,
            max_words=self.max_words,
        )
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> HashedLinearScorer:
        saved = np.load(io.BytesIO(data))
        return cls(
            saved["weights"].astype(np.float64),
            float(saved["bias"]),
            int(saved["hash_bits"]),
            int(saved["max_words"]),
            {},
        )


def train_hashed_linear(
    positives: pa.Array, negatives: pa.Array, config: ClassifierConfig
) -> HashedLinearScorer:
    """Fit on a class-balanced sample of both; report accuracy and AUC on a held-out share."""
    rng = np.random.default_rng(config.seed)
    per_class = min(len(positives), len(negatives), config.max_training_docs)
    if per_class < 1:
        raise ValueError("the quality classifier needs at least one positive and one negative document")
    texts = pa.concat_arrays(
        [
            positives.take(pa.array(rng.choice(len(positives), per_class, replace=False))),
            negatives.take(pa.array(rng.choice(len(negatives), per_class, replace=False))),
        ]
    )
    labels = np.concatenate([np.ones(per_class), np.zeros(per_class)])
    order = rng.permutation(len(labels))
    texts, labels = texts.take(pa.array(order)), labels[order]
    held = int(len(labels) * config.holdout_fraction) if len(labels) >= 20 else 0
    train_n = len(labels) - held
    indptr, feature, value = hashed_features(texts, config.hash_bits, config.max_words)

    weights = np.zeros(1 << config.hash_bits)
    squared = np.full(1 << config.hash_bits, 1e-8)
    bias, bias_squared = 0.0, 1e-8
    batch = 64
    for _ in range(config.epochs):
        for start in rng.permutation(np.arange(0, train_n, batch)):
            stop = min(start + batch, train_n)
            lo, hi = indptr[start], indptr[stop]
            doc = np.repeat(np.arange(stop - start), np.diff(indptr[start : stop + 1]))
            f, v = feature[lo:hi], value[lo:hi]
            margin = np.bincount(doc, weights=weights[f] * v, minlength=stop - start) + bias
            error = _sigmoid(margin) - labels[start:stop]
            grad = np.bincount(f, weights=v * error[doc], minlength=len(weights))[f] / (stop - start)
            touched, first = np.unique(f, return_index=True)
            grad_touched = grad[first] + config.l2 * weights[touched]
            squared[touched] += grad_touched**2
            weights[touched] -= config.learning_rate * grad_touched / np.sqrt(squared[touched])
            bias_grad = float(error.mean())
            bias_squared += bias_grad**2
            bias -= config.learning_rate * bias_grad / np.sqrt(bias_squared)

    scorer = HashedLinearScorer(weights, bias, config.hash_bits, config.max_words, {})
    facts: dict[str, Any] = {
        "positives": per_class,
        "negatives": per_class,
        "trained_on": train_n,
        "held_out": held,
    }
    if held:
        scores = scorer._margins(
            indptr[train_n:] - indptr[train_n], feature[indptr[train_n] :], value[indptr[train_n] :]
        )
        held_labels = labels[train_n:]
        facts["held_out_accuracy"] = float(ratio(((scores > 0) == (held_labels == 1)).sum(), held))
        facts["held_out_auc"] = _auc(scores, held_labels)
    scorer.facts = facts
    return scorer


def pareto_keep(ids: pa.Array, scores: np.ndarray, alpha: float) -> np.ndarray:
    """GPT-3's rule, keep if ``np.random.pareto(alpha) > 1 - score``, with the draw made from
    the document id so a re-run keeps exactly the same documents."""
    id_hashes = np.array([int(i[:16], 16) for i in ids.to_pylist()], dtype=np.uint64)
    uniform = (mix64(id_hashes) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    draw = (1.0 - uniform) ** (-1.0 / alpha) - 1.0  # inverse CDF of numpy's (Lomax) Pareto
    return draw > 1.0 - scores
