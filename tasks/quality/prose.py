"""Prose rules in the spirit of Gopher (Rae et al. 2021, appendix A) and C4 (Raffel et al. 2020).

Default thresholds are Gopher's. Words are whitespace-separated tokens; "word" counts and the
mean word length use tokens with a letter or digit (Gopher's non-symbol words). Repetition
signals are fractions of a document's word characters (see ``segments.ngram_repetition``).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict

from tasks.quality.rules import Bounds
from tasks.quality.segments import (
    duplicate_fractions,
    ngram_repetition,
    ratio,
    split_lines,
    split_paragraphs,
    split_words,
)

STOP_WORDS = ["the", "be", "to", "of", "and", "that", "have", "with"]  # Gopher's list
TOP_NGRAMS = {2: 0.20, 3: 0.18, 4: 0.16}
DUPLICATE_NGRAMS = {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}
_BULLET_RE = "^\\s*[-*•‣◦●▪·]"
_ELLIPSIS_RE = "(\\.\\.\\.|…)\\s*$"
_TERMINAL_RE = "[.!?\"'”’]\\s*$"


class ProseRules(BaseModel):
    """Bounds of each prose rule, applied in this order."""

    model_config = ConfigDict(extra="forbid")

    word_count: Bounds = Bounds(min=50, max=100_000)
    mean_word_length: Bounds = Bounds(min=3, max=10)
    symbol_word_ratio: Bounds = Bounds(max=0.1)
    bullet_line_fraction: Bounds = Bounds(max=0.9)
    ellipsis_line_fraction: Bounds = Bounds(max=0.3)
    alpha_word_fraction: Bounds = Bounds(min=0.8)
    stop_words: Bounds = Bounds(min=2)
    lorem_ipsum: Bounds = Bounds(max=0)
    terminal_punctuation_line_fraction: Bounds = Bounds()
    duplicate_line_fraction: Bounds = Bounds(max=0.3)
    duplicate_paragraph_fraction: Bounds = Bounds(max=0.3)
    duplicate_line_char_fraction: Bounds = Bounds(max=0.2)
    duplicate_paragraph_char_fraction: Bounds = Bounds(max=0.2)
    top_2gram: Bounds = Bounds(max=TOP_NGRAMS[2])
    top_3gram: Bounds = Bounds(max=TOP_NGRAMS[3])
    top_4gram: Bounds = Bounds(max=TOP_NGRAMS[4])
    duplicate_5gram: Bounds = Bounds(max=DUPLICATE_NGRAMS[5])
    duplicate_6gram: Bounds = Bounds(max=DUPLICATE_NGRAMS[6])
    duplicate_7gram: Bounds = Bounds(max=DUPLICATE_NGRAMS[7])
    duplicate_8gram: Bounds = Bounds(max=DUPLICATE_NGRAMS[8])
    duplicate_9gram: Bounds = Bounds(max=DUPLICATE_NGRAMS[9])
    duplicate_10gram: Bounds = Bounds(max=DUPLICATE_NGRAMS[10])


PROSE_RULES = list(ProseRules.model_fields)


def _numpy(array: pa.Array) -> np.ndarray:
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.float64)


def _line_fraction(lines, pattern: str) -> np.ndarray:
    hits = np.asarray(
        pc.match_substring_regex(lines.values, pattern).to_numpy(zero_copy_only=False), dtype=bool
    )
    return ratio(np.bincount(lines.doc[hits], minlength=lines.n_docs), lines.counts)


def prose_signals(texts: pa.Array) -> dict[str, np.ndarray]:
    """Every prose signal for a batch of texts, keyed by rule name."""
    texts = pc.fill_null(texts, "")
    words = split_words(texts)
    word_lengths = words.lengths()
    has_alnum = words.per_distinct(lambda w: pc.match_substring_regex(w, "[\\p{L}\\p{N}]")).astype(bool)
    has_alpha = words.per_distinct(lambda w: pc.match_substring_regex(w, "\\p{L}")).astype(bool)
    real_words = np.bincount(words.doc[has_alnum], minlength=words.n_docs)
    stop_index = words.per_distinct(
        lambda w: pc.fill_null(pc.index_in(pc.utf8_lower(w), value_set=pa.array(STOP_WORDS)), -1)
    )
    is_stop = stop_index >= 0
    stop_keys = np.unique(words.doc[is_stop] * len(STOP_WORDS) + stop_index[is_stop])
    # count_substring_regex is several times faster than count_substring on literals here
    symbols = sum(_numpy(pc.count_substring_regex(texts, p)) for p in ("#", "\\.\\.\\.", "…"))
    lines = split_lines(texts)
    paragraphs = split_paragraphs(texts)
    line_dup, line_dup_chars = duplicate_fractions(lines)
    paragraph_dup, paragraph_dup_chars = duplicate_fractions(paragraphs)
    signals = {
        "word_count": real_words.astype(np.float64),
        "mean_word_length": ratio(
            np.bincount(words.doc[has_alnum], weights=word_lengths[has_alnum], minlength=words.n_docs),
            real_words,
        ),
        "symbol_word_ratio": ratio(symbols, words.counts),
        "bullet_line_fraction": _line_fraction(lines, _BULLET_RE),
        "ellipsis_line_fraction": _line_fraction(lines, _ELLIPSIS_RE),
        "alpha_word_fraction": ratio(np.bincount(words.doc[has_alpha], minlength=words.n_docs), words.counts),
        "stop_words": np.bincount(stop_keys // len(STOP_WORDS), minlength=words.n_docs).astype(np.float64),
        "lorem_ipsum": _numpy(pc.count_substring(pc.utf8_lower(texts), "lorem ipsum")),
        "terminal_punctuation_line_fraction": _line_fraction(lines, _TERMINAL_RE),
        "duplicate_line_fraction": line_dup,
        "duplicate_paragraph_fraction": paragraph_dup,
        "duplicate_line_char_fraction": line_dup_chars,
        "duplicate_paragraph_char_fraction": paragraph_dup_chars,
    }
    repetition = ngram_repetition(words, tuple(TOP_NGRAMS), tuple(DUPLICATE_NGRAMS))
    return signals | repetition
