"""A trained byte-level BPE (HF ``tokenizers``' ``tokenizer.json``) as a ``tiktoken.Encoding``
that gives the same ids, several times faster.

``tokenizers`` stays the trainer and ``tokenizer.json`` the versioned artefact; this module only
encodes. The encoding is built from the file: the mergeable ranks are the vocabulary's byte
strings (GPT-2's bytes <-> unicode table undone) at their ids, the pre-tokenizer is
``ByteLevel``'s regex, and the special tokens are left out of the ranks, because the shard
stage encodes special-token text as plain text (``encode_special_tokens``).

Why the ids are equal. ``tokenizers`` applies the lowest-ranked *merge* (a pair of tokens) of
a piece first; tiktoken merges the adjacent pair whose *concatenation* has the lowest rank.
When every merge creates a token whose id grows with the merge's rank (:func:`from_tokenizer_json`
checks it), the two make the same choice until tiktoken joins a pair ``(x, y)`` into a token
``t`` that is not ``t``'s merge. At that first difference nothing has crossed the span of ``t``
(``x`` and ``y`` tile it), so inside that span both have applied exactly the merges that
``tokenizers`` applies to ``t``'s bytes alone below ``t``'s rank; if ``tokenizers`` encodes
``t``'s bytes as ``[t]``, those end in ``t``'s own merge pair, not ``(x, y)``: a contradiction.
So tiktoken can only differ through a token ``t`` whose own bytes ``tokenizers`` does not
encode as ``[t]`` (an *unreachable* token), and that token's bytes then lie inside one output
token. A document whose tiktoken ids contain such a token is re-encoded with ``tokenizers``
(:attr:`TiktokenBPE.suspect`, counted as a fallback). A tokenizer trained here has none
(``tests/tasks/test_encoder_ids.py`` checks ids on generated text and every code point).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache

import numpy as np
import tiktoken
from tokenizers import Tokenizer

# ByteLevel(use_regex=True)'s split, as tokenizers writes it
BYTE_LEVEL_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class NotReproducible(ValueError):
    """A tokenizer whose ids tiktoken cannot be made to give (the sentence says why)."""


@cache
def byte_symbols() -> dict[str, int]:
    """GPT-2's table, inverted: the printable character ByteLevel writes for each byte -> the byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    shifted = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + shifted)
            shifted += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


@dataclass(frozen=True)
class TiktokenBPE:
    """The encoding and the ids after which a document is re-encoded by ``tokenizers``."""

    encoding: tiktoken.Encoding
    suspect: np.ndarray  # bool per id: the token holds an unreachable token's bytes

    def encode(self, texts: list[str]) -> tuple[list[list[int]], np.ndarray]:
        """Ids per text (special-token text as plain text) and the indices of the texts whose
        ids contain a suspect token (to re-encode with ``tokenizers``)."""
        encoded = [self.encoding.encode_ordinary(text) for text in texts]
        if not self.suspect.any():
            return encoded, np.zeros(0, np.int64)
        return encoded, np.array(
            [k for k, ids in enumerate(encoded) if ids and self.suspect[np.array(ids)].any()], np.int64
        )


def from_tokenizer_json(tokenizer_json: str) -> TiktokenBPE:
    """The tiktoken twin of a byte-level BPE; raises :class:`NotReproducible` naming what differs."""
    spec = json.loads(tokenizer_json)
    _check_shape(spec)
    model = spec["model"]
    vocab: dict[str, int] = model["vocab"]
    added = {token["content"]: token["id"] for token in spec.get("added_tokens", [])}
    not_special = [t["content"] for t in spec.get("added_tokens", []) if not t.get("special")]
    if not_special:
        raise NotReproducible(f"added tokens that are not special ({not_special[:3]}) are matched in text")
    to_byte = byte_symbols()
    missing = [b for s, b in to_byte.items() if s not in vocab]
    if missing:
        raise NotReproducible(f"{len(missing)} of the 256 byte symbols are not in the vocabulary")
    ranks: dict[bytes, int] = {}
    for symbol, token_id in vocab.items():
        if symbol in added:
            continue
        try:
            ranks[bytes(to_byte[c] for c in symbol)] = token_id
        except KeyError:
            raise NotReproducible(f"vocabulary entry {symbol!r} is not byte-level") from None
    previous = -1
    for pair in model["merges"]:
        left, right = pair if isinstance(pair, list) else pair.split(" ")
        token_id = vocab.get(left + right)
        if token_id is None or token_id <= previous:
            raise NotReproducible("the merges do not create tokens in the order of their ids")
        previous = token_id
    n_vocab = max([*vocab.values(), *added.values()]) + 1
    encoding = tiktoken.Encoding(
        "tokenlake-bpe",
        pat_str=BYTE_LEVEL_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={content: token_id for content, token_id in added.items()},
    )
    return TiktokenBPE(encoding, _suspect_ids(tokenizer_json, vocab, added, n_vocab))


def _check_shape(spec: dict) -> None:
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise NotReproducible(f"the model is {model.get('type')!r}, not BPE")
    if model.get("dropout") not in (None, 0.0):
        raise NotReproducible(f"the BPE model has dropout {model['dropout']}")
    for field in ("continuing_subword_prefix", "end_of_word_suffix", "ignore_merges"):
        if model.get(field):
            raise NotReproducible(f"the BPE model sets {field}={model[field]!r}")
    if spec.get("normalizer") is not None:
        raise NotReproducible("the tokenizer has a normalizer")
    for field in ("truncation", "padding"):
        if spec.get(field) is not None:
            raise NotReproducible(f"the tokenizer sets {field}")
    post = spec.get("post_processor")
    if post is not None and post.get("type") != "ByteLevel":  # ByteLevel only moves offsets
        raise NotReproducible(f"the post-processor {post.get('type')!r} adds or changes ids")
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") != "ByteLevel" or pre.get("add_prefix_space") or not pre.get("use_regex", True):
        raise NotReproducible(f"the pre-tokenizer is not ByteLevel(add_prefix_space=False): {pre}")


def _suspect_ids(
    tokenizer_json: str, vocab: dict[str, int], added: dict[str, int], n_vocab: int
) -> np.ndarray:
    """Ids of the tokens whose bytes contain an unreachable token's bytes (see the module)."""
    model = Tokenizer.from_str(tokenizer_json).model
    unreachable = {
        symbol
        for symbol, token_id in vocab.items()
        if symbol not in added and [t.id for t in model.tokenize(symbol)] != [token_id]
    }
    suspect = np.zeros(n_vocab, bool)
    if unreachable:
        for symbol, token_id in vocab.items():
            if symbol not in added and any(u in symbol for u in unreachable):
                suspect[token_id] = True
    return suspect
